"""What the local runtime starts: the one-line shell wrapper around a workload's command, and
the environment the workload gets."""

from __future__ import annotations

from spoke.ports import Launch

#: Runs the command, then records its exit status in the file named by $0.
WRAPPER = '"$@"; code=$?; echo $code > "$0"; exit $code'
#: What a start as the spoke's own user runs: its output appended to the log named by $2, in
#: the working directory named by $3; its exit code appended, after the last part of $0 (the
#: run's key: what an exit file of its own would be called), to the shared exit log named by
#: $1 (spoke.runtime.exitlog). The shell creates the log, not the spoke: creating a file
#: costs ~0.3 ms of CPU on the development machine, the largest single part of a start in the
#: spoke's event loop, and in the child it runs beside the loop instead of holding it up.
WRAPPER_LOGGED = (
    'x=$1; exec >>"$2" 2>&1 || exit 126; cd -- "$3" || exit 126; shift 3; '
    '"$@"; code=$?; echo "${0##*/} $code" >>"$x"; exit $code'
)
#: What a workload inherits from the spoke's environment: nothing else, so the spoke's own
#: secrets (NATS credentials, cloud keys, tokens) never reach a workload. A workload gets
#: these, then its spec's `env`, then gpufed's own variables (CUDA_VISIBLE_DEVICES, GPUFED_*).
INHERITED_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE",
    "TZ", "TMPDIR",
)  # fmt: skip


def environment(
    launch: Launch, rank: int, inherited: dict[str, str], master_port: int | None = None
) -> dict[str, str]:
    """Rank `rank`'s environment: `inherited`, the spec's `env`, then gpufed's own; a gang's
    ranks (all on this host) meet at rank 0 on 127.0.0.1:`master_port`."""
    assignment = launch.assignments[rank]
    env = dict(inherited)
    env.update(launch.spec.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in assignment.devices),
            "GPUFED_WORKLOAD_ID": launch.workload_id,
            "GPUFED_EPOCH": str(launch.epoch),
            "GPUFED_NODE": assignment.node,
            "GPUFED_NODE_RANK": str(rank),
            "GPUFED_NUM_NODES": str(len(launch.assignments)),
        }
    )
    if master_port is not None:
        env["GPUFED_MASTER_ADDR"], env["GPUFED_MASTER_PORT"] = "127.0.0.1", str(master_port)
    if assignment.fraction is not None:
        env["GPUFED_GPU_FRACTION"] = f"{assignment.fraction:g}"
    return env
