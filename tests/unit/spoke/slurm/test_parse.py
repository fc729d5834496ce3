"""Parsers of Slurm's output, fed lines captured from Debian's slurm-wlm 22.05 daemons."""

from __future__ import annotations

import pytest

from schemas import EventPhase
from spoke.inventory.slurm import gpu_model, node_inventories, schedulable_state
from spoke.runtime.slurm.status import final_outcome, hopeless
from spoke.slurm.parse import (
    FIELD_SEPARATOR,
    JobIdentity,
    exit_status,
    expand_hostlist,
    gpu_counts,
    job_comment,
    job_identity,
    key_values,
    parse_job,
    parse_nodes,
    parse_queue,
)

# `scontrol -d -o show node`: n1 runs 5 GPUs of jobs, n2 is drained with a reason.
NODES = """\
NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=8 CPUTot=8 CPULoad=2.28 AvailableFeatures=ib,nvlink ActiveFeatures=ib,nvlink Gres=gpu:h100:8 GresDrain=N/A GresUsed=gpu:h100:5(IDX:0-4) NodeAddr=127.0.0.1 NodeHostName=vm Port=16821 Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=18296 Sockets=8 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-11-30T20:46:18 SlurmdStartTime=2026-11-30T20:55:08 LastBusyTime=2026-11-30T20:57:08 CfgTRES=cpu=8,mem=1000M,billing=8 AllocTRES=cpu=2 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=2.28 AvailableFeatures=ib ActiveFeatures=ib Gres=gpu:h100:8 GresDrain=N/A GresUsed=gpu:h100:0(IDX:N/A) NodeAddr=127.0.0.1 NodeHostName=vm Port=16822 Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=18296 Sockets=8 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-11-30T20:46:18 SlurmdStartTime=2026-11-30T20:55:08 LastBusyTime=2026-11-30T20:55:40 CfgTRES=cpu=8,mem=1000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=bad gpu [root@2026-11-30T20:58:23]
"""  # noqa: E501
# `squeue --me --states=all --noheader -o SQUEUE_FORMAT` (fields separated by \x1f).
QUEUE = """\
5\x1fCANCELLED\x1fNone\x1fn1\x1fgres:gpu:1\x1f(null)\x1ft4
8\x1fCANCELLED\x1fBeginTime\x1f\x1fgres:gpu:8\x1f(null)\x1ft8
1\x1fCOMPLETED\x1fNone\x1fn[1-2]\x1fgres:gpu:h100:4\x1fgpufed:s1:w1:0\x1fgpufed-w1-e0
2\x1fRUNNING\x1fNone\x1fn1\x1fgres:gpu:2\x1f(null)\x1fother
11\x1fPENDING\x1fResources\x1f\x1fgres:gpu:8\x1f(null)\x1fpend
9\x1fRUNNING\x1fNone\x1fn1\x1fgres:gpu:h100:3\x1fgpufed:s1:w9:2\x1fgpufed-w9-e2
"""
# `scontrol -o show job 9`, trimmed of fields nobody reads.
JOB = (
    "JobId=9 JobName=gpufed-w9-e2 UserId=root(0) GroupId=root(0) JobState=FAILED "
    "Reason=NonZeroExitCode Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 ExitCode=3:0 "
    "RunTime=00:00:07 TimeLimit=365-00:00:00 Partition=gpu ReqNodeList=n1 NodeList=n[1-2] "
    "BatchHost=n1 NumNodes=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* Comment=gpufed:s1:w9:2  "
    "StdOut=/tmp/w9.log TresPerNode=gres:gpu:h100:3 \n"
)


def test_key_values_keep_values_with_spaces_and_odd_keys() -> None:
    kv = key_values(NODES.splitlines()[1])
    assert kv["Reason"] == "bad gpu [root@2026-11-30T20:58:23]"
    assert kv["OS"] == "Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0"
    assert kv["State"] == "IDLE+DRAIN"
    assert key_values(JOB)["NtasksPerN:B:S:C"] == "0:0:*:*"


def test_nodes_parse_into_gpus_state_features_and_partitions() -> None:
    n1, n2 = parse_nodes(NODES)
    assert (n1.name, n1.state, n1.gres, n1.gres_used) == ("n1", "MIXED", {"h100": 8}, {"h100": 5})
    assert n1.features == ("ib", "nvlink") and n1.partitions == ("gpu",)
    assert (n2.state, n2.gres_used, n2.reason) == (
        "IDLE+DRAIN",
        {"h100": 0},
        "bad gpu [root@2026-11-30T20:58:23]",
    )


@pytest.mark.parametrize(
    ("gres", "counts"),
    [
        ("gpu:h100:8", {"h100": 8}),
        ("gpu:4", {"": 4}),
        ("gpu", {"": 1}),
        ("gpu:h100:5(IDX:0-4)", {"h100": 5}),
        ("gpu:h100:0(IDX:N/A)", {"h100": 0}),
        ("gpu:a100:2(S:0-1),gpu:v100:4(S:0),shard:8", {"a100": 2, "v100": 4}),
        ("gres:gpu:h100:3", {"h100": 3}),
        ("gres/gpu:4", {"": 4}),
        ("(null)", {}),
        ("", {}),
        ("mps:100", {}),
    ],
)
def test_gpu_counts(gres: str, counts: dict[str, int]) -> None:
    assert gpu_counts(gres) == counts


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("n1", ("n1",)),
        ("n[1-2]", ("n1", "n2")),
        ("n[1-3,7],gpu-a[08-10]", ("n1", "n2", "n3", "n7", "gpu-a08", "gpu-a09", "gpu-a10")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_queue_lines_parse_with_nodes_gpus_and_comment() -> None:
    jobs = {job.job_id: job for job in parse_queue(QUEUE)}
    assert jobs["1"].nodes == ("n1", "n2") and jobs["1"].gpus_per_node == {"h100": 4}
    assert jobs["1"].comment == "gpufed:s1:w1:0" and jobs["1"].name == "gpufed-w1-e0"
    assert (jobs["8"].nodes, jobs["8"].reason, jobs["8"].comment) == ((), "BeginTime", "")
    assert jobs["11"].state == "PENDING" and jobs["11"].reason == "Resources"
    assert parse_queue("garbage\n" + FIELD_SEPARATOR * 3) == []


def test_a_job_parses_with_its_exit_code_and_nodes() -> None:
    job = parse_job(JOB)
    assert job is not None
    assert (job.job_id, job.state, job.reason, job.exit_code, job.nodes) == (
        "9",
        "FAILED",
        "NonZeroExitCode",
        3,
        ("n1", "n2"),
    )
    assert parse_job("") is None


@pytest.mark.parametrize(
    ("value", "code"), [("0:0", 0), ("3:0", 3), ("0:15", -15), ("0:9", -9), ("", None)]
)
def test_exit_status(value: str, code: int | None) -> None:
    assert exit_status(value) == code


def test_the_comment_carries_spoke_workload_and_epoch() -> None:
    comment = job_comment("hpc-eu", "train-7", 2)
    assert job_identity(comment) == JobIdentity("hpc-eu", "train-7", 2)
    for other in ("", "(null)", "my job", "gpufed:a:b", "gpufed:a:b:c", "gpufed:a b:c:1"):
        assert job_identity(other) is None


@pytest.mark.parametrize(
    ("state", "exit_code", "phase", "reason"),
    [
        ("COMPLETED", 0, EventPhase.SUCCEEDED, ""),
        ("FAILED", 3, EventPhase.FAILED, "exit_code"),
        ("FAILED", 127, EventPhase.FAILED, "command_not_found"),
        ("FAILED", -9, EventPhase.FAILED, "SIGKILL"),
        ("TIMEOUT", -15, EventPhase.FAILED, "max_runtime_exceeded"),
        ("OUT_OF_MEMORY", 0, EventPhase.FAILED, "out_of_memory"),
        ("NODE_FAIL", None, EventPhase.FAILED, "node_fail"),
        ("CANCELLED", -15, EventPhase.FAILED, "cancelled_outside_gpufed"),
        ("PREEMPTED", None, EventPhase.PREEMPTED, "slurm_preempted"),
    ],
)
def test_final_states_mean_phases(
    state: str, exit_code: int | None, phase: EventPhase, reason: str
) -> None:
    outcome = final_outcome(state, exit_code)
    assert (outcome.phase, outcome.reason) == (phase, reason)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("Resources", False),
        ("Priority", False),
        ("BeginTime", False),
        ("BadConstraints", True),
        ("InvalidAccount", True),
        ("ReqNodeNotAvail, UnavailableNodes:n2", True),
    ],
)
def test_hopeless_pending_reasons(reason: str, expected: bool) -> None:
    assert hopeless(reason) is expected


@pytest.mark.parametrize(
    ("state", "schedulable"),
    [
        ("IDLE", True),
        ("MIXED", True),
        ("ALLOCATED", True),
        ("IDLE+DRAIN", False),
        ("MIXED+DRAIN", False),
        ("DOWN+DRAIN", False),
        ("DOWN+NOT_RESPONDING", False),
        ("IDLE+NOT_RESPONDING", False),
        ("IDLE+RESERVED", False),
        ("IDLE+POWERED_DOWN", False),
        ("UNKNOWN", False),
        ("FUTURE", False),
    ],
)
def test_schedulable_states(state: str, schedulable: bool) -> None:
    assert schedulable_state(state) is schedulable


@pytest.mark.parametrize(
    ("gpu_type", "model"),
    [("h100", "H100"), ("nvidia_h100_80gb_hbm3", "H100"), ("a100_80g", "A100"), ("", "GPU")],
)
def test_gpu_models_from_gres_types(gpu_type: str, model: str) -> None:
    assert gpu_model(gpu_type) == model


def test_inventory_counts_gpus_of_others_jobs_as_busy() -> None:
    queue = parse_queue(QUEUE)
    nodes = {n.name: n for n in node_inventories(parse_nodes(NODES), queue, "s1")}
    # n1: 5 GPUs used, of which 3 by this spoke's running job w9 ("other" holds the other 2).
    assert nodes["n1"].busy_outside == 2
    assert nodes["n2"].busy_outside == 0 and nodes["n2"].schedulable is False
    as_other_spoke = {n.name: n for n in node_inventories(parse_nodes(NODES), queue, "s2")}
    assert as_other_spoke["n1"].busy_outside == 5


def test_a_node_with_two_gpu_types_is_one_pool_per_type() -> None:
    line = (
        "NodeName=mix1 Gres=gpu:a100:4,gpu:v100:4 GresUsed=gpu:a100:1(IDX:0),gpu:v100:0(IDX:N/A) "
        "State=MIXED Partitions=gpu"
    )
    pools = node_inventories(parse_nodes(line), [], "s1")
    assert [(p.name, p.gpu_model, p.gpu_count, p.busy_outside) for p in pools] == [
        ("mix1/a100", "A100", 4, 1),
        ("mix1/v100", "V100", 4, 0),
    ]
