"""Pure parsers of what the Slurm CLIs print: `scontrol -d -o show node`, `scontrol -o show job`,
`squeue -o` with the format below, hostlists ("n[1-3,7]") and GRES strings ("gpu:h100:8").

No I/O: every function takes text and returns plain data, so the tests feed them output captured
from real daemons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: `squeue -o` fields, separated by ASCII unit separators (no job name or comment has one).
FIELD_SEPARATOR = "\x1f"
SQUEUE_FORMAT = FIELD_SEPARATOR.join(["%i", "%T", "%r", "%N", "%b", "%k", "%j"])
#: A job's comment names the spoke, workload and epoch it runs for: "gpufed:<spoke>:<wid>:<epoch>".
COMMENT_PREFIX = "gpufed"
_COMMENT = re.compile(r"^gpufed:([A-Za-z0-9_-]+):([A-Za-z0-9_-]+):([0-9]+)$")
# "Key=" at the start of a line or after a space; keys look like "NodeName", "Socks/Node",
# "AllocNode:Sid" or "NtasksPerN:B:S:C".
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:]*)=")
_NULL = {"", "(null)", "N/A", "None"}
#: An inventory pool "<node>/<type>" stands for the GPUs of one type on a node with several.
POOL_SEPARATOR = "/"
#: States of a job that still holds (or waits for) its nodes. COMPLETING is among them: the job's
#: processes ended, but its GPUs are free only once the epilog is done.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
    }
)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as `scontrol -d -o show node` reports it."""

    name: str
    state: str  # "IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN", "DOWN+NOT_RESPONDING", ...
    gres: dict[str, int] = field(default_factory=dict)  # GPU type ("" if untyped) -> count
    gres_used: dict[str, int] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """One line of `squeue -o SQUEUE_FORMAT`."""

    job_id: str
    state: str  # "PENDING", "RUNNING", "COMPLETING", "COMPLETED", "FAILED", ...
    reason: str
    nodes: tuple[str, ...]
    gpus_per_node: dict[str, int]  # GPU type ("" if untyped) -> count on each node
    comment: str
    name: str


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """Whose job it is: the spoke that submitted it, the workload and the assignment epoch."""

    spoke_id: str
    workload_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class JobDetail:
    """What `scontrol -o show job ID` says about an ended (or running) job."""

    job_id: str
    state: str
    reason: str
    exit_code: int | None  # the batch script's exit status; negative: killed by that signal
    nodes: tuple[str, ...]


def job_comment(spoke_id: str, workload_id: str, epoch: int) -> str:
    """The comment that identifies a job as (spoke, workload, epoch)."""
    return f"{COMMENT_PREFIX}:{spoke_id}:{workload_id}:{epoch}"


def job_identity(comment: str) -> JobIdentity | None:
    """The identity a job's comment carries; None for jobs gpufed did not submit."""
    match = _COMMENT.match(comment.strip())
    if match is None:
        return None
    return JobIdentity(match.group(1), match.group(2), int(match.group(3)))


def key_values(line: str) -> dict[str, str]:
    """`Key=value Key2=value with spaces ...` (one record of `scontrol -o`) as a dict."""
    matches = list(_KEY.finditer(line))
    result: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        result[match.group(1)] = line[match.end() : end].strip()
    return result


def parse_nodes(text: str) -> list[SlurmNode]:
    """Nodes from `scontrol -d -o show node` (one node per line)."""
    nodes = []
    for line in text.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        kv = key_values(line.strip())
        features = kv.get("ActiveFeatures") or kv.get("AvailableFeatures") or ""
        reason = kv.get("Reason", "")
        nodes.append(
            SlurmNode(
                name=kv["NodeName"],
                state=kv.get("State", "UNKNOWN"),
                gres=gpu_counts(kv.get("Gres", "")),
                gres_used=gpu_counts(kv.get("GresUsed", "")),
                features=_items(features),
                partitions=_items(kv.get("Partitions", "")),
                reason="" if reason in _NULL else reason,
            )
        )
    return nodes


def gpu_counts(gres: str) -> dict[str, int]:
    """GPU type -> count from a GRES string.

    "gpu:h100:8" -> {"h100": 8}; "gpu:4" -> {"": 4};
    "gpu:a100:2(S:0),gpu:v100:0(IDX:N/A),shard:8" -> {"a100": 2, "v100": 0};
    "gres:gpu:h100:3" and "gres/gpu:4" (squeue's TRES per node) are read the same way.
    """
    counts: dict[str, int] = {}
    for item in _split_outside_parens(gres):
        item = re.sub(r"\(.*\)$", "", item.strip())
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix) :]
        parts = item.split(":")
        if parts[0] != "gpu" or item in _NULL:
            continue
        if len(parts) == 1:
            gpu_type, count = "", "1"
        elif len(parts) == 2:
            gpu_type, count = ("", parts[1]) if parts[1].isdigit() else (parts[1], "1")
        else:
            gpu_type, count = parts[1], parts[2]
        if count.isdigit():
            counts[gpu_type] = counts.get(gpu_type, 0) + int(count)
    return counts


def parse_queue(text: str) -> list[QueuedJob]:
    """Jobs from `squeue --noheader -o SQUEUE_FORMAT`."""
    jobs = []
    for line in text.splitlines():
        parts = line.split(FIELD_SEPARATOR)
        if len(parts) != 7:
            continue
        job_id, state, reason, nodelist, tres, comment, name = parts
        jobs.append(
            QueuedJob(
                job_id=job_id.strip(),
                state=state.strip(),
                reason="" if reason in _NULL else reason,
                nodes=expand_hostlist(nodelist.strip()),
                gpus_per_node=gpu_counts(tres),
                comment="" if comment in _NULL else comment,
                name=name,
            )
        )
    return jobs


def parse_job(text: str) -> JobDetail | None:
    """The job of `scontrol -o show job ID`; None when the text holds no job."""
    for line in text.splitlines():
        if line.startswith("JobId="):
            kv = key_values(line)
            reason = kv.get("Reason", "")
            return JobDetail(
                job_id=kv["JobId"],
                state=kv.get("JobState", "UNKNOWN"),
                reason="" if reason in _NULL else reason,
                exit_code=exit_status(kv.get("ExitCode", "")),
                nodes=expand_hostlist(kv.get("NodeList", "")),
            )
    return None


def exit_status(value: str) -> int | None:
    """Slurm's "code:signal": "3:0" -> 3, "0:15" -> -15 (killed by SIGTERM); None if unknown."""
    code, _, sig = value.partition(":")
    if not code.isdigit():
        return None
    if sig.isdigit() and int(sig) != 0:
        return -int(sig)
    return int(code)


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """ "n[1-3,7],gpu-a[01-02]" -> ("n1", "n2", "n3", "n7", "gpu-a01", "gpu-a02")."""
    if hostlist in _NULL:
        return ()
    hosts: list[str] = []
    for item in _split_outside_brackets(hostlist):
        hosts.extend(_expand_one(item))
    return tuple(hosts)


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item] if item else []
    head, tail = item[: match.start()], item[match.end() :]
    names: list[str] = []
    for part in match.group(1).split(","):
        low, sep, high = part.partition("-")
        if not sep:
            names.extend(_expand_one(head + low + tail))
            continue
        width = len(low)
        for number in range(int(low), int(high) + 1):
            names.extend(_expand_one(f"{head}{number:0{width}d}{tail}"))
    return names


def _split_outside_brackets(text: str) -> list[str]:
    return _split_outside(text, "[", "]")


def _split_outside_parens(text: str) -> list[str]:
    return _split_outside(text, "(", ")")


def _split_outside(text: str, opening: str, closing: str) -> list[str]:
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return [item for item in items if item]


def _items(value: str) -> tuple[str, ...]:
    if value in _NULL:
        return ()
    return tuple(item for item in value.split(",") if item)
