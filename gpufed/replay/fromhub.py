"""`gpufed replay --from-hub URL`: the federation's own recent workloads as a trace.

Reads the hub's REST API: `GET /v1/workloads?since=` for the workloads submitted in the last
`--since` (only those: a hub keeps 90 days of ended work, at about 13 KiB of its memory each
while it answers), `GET /v1/policy` for the policy in force and, without `--fleet`, `GET
/v1/spokes` for the fleet. A workload becomes a job with its spec's shape, team and class, its
submit time, and as run time what its attempts ran (`run_time`), so work that was stopped
(preempted, drained) and waits or ran again counts with what it ran before. Workloads none of
whose attempts started have no run time to replay and are left out (counted in `skipped`). The
token is the other commands' (`gpufed.client.default_token`: `GPUFED_TOKEN`, else the file
`GPUFED_TOKEN_FILE` names, else `gpufed up`'s `.gpufed/admin.token`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.client import ApiError, HubClient
from gpufed.replay.fleet import Fleet, NodeSpec, SpokeSpec
from gpufed.replay.traces import Job
from schemas import SpokeKind

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
#: Most workloads one fetch asks for (the API returns the newest first).
MAX_WORKLOADS = 1_000_000


class HubFetchError(ValueError):
    """The hub could not be read, or its answer makes no trace."""


def parse_since(text: str) -> float:
    """'7d', '12h', '30m', '90s' or plain seconds -> seconds."""
    found = _SINCE.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise HubFetchError(f"--since {text!r}: use a positive duration like 7d, 12h, 30m, 900s")
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


@dataclass(slots=True)
class HubHistory:
    """What the hub said: jobs to replay, its policy (as a dict), its spokes, what was left out,
    and `start`, when the first job was submitted (epoch s): the replay's time 0."""

    jobs: list[Job]
    policy: dict[str, Any]
    spokes: list[dict[str, Any]]
    skipped: Counter[str] = field(default_factory=Counter)
    start: float = 0.0


def fetch(
    url: str, since_s: float, now: float, resume: bool = True, timeout_s: float = 30.0
) -> HubHistory:
    """Read the workloads submitted since `now - since_s`, the policy and the spokes, through
    the CLI's own client (`gpufed.client.HubClient`): the same token, and `url` may list
    several hubs, comma-separated, as `gpufed up --hubs 2` prints them. `resume`: as
    `run_time`'s."""
    client = HubClient(url, timeout_s=timeout_s)
    try:
        records = client.workloads(limit=MAX_WORKLOADS, since=max(0.0, now - since_s))
        policy = client.policy()
        spokes = client.spokes()
    except ApiError as exc:
        raise HubFetchError(f"cannot read the hub at {url}: {exc}") from exc
    finally:
        client.close()
    if not isinstance(records, list) or not isinstance(policy, dict):
        raise HubFetchError(f"{url} did not answer like a gpufed hub")
    jobs, skipped, start = to_jobs(records, now - since_s, now, resume)
    return HubHistory(jobs, policy, spokes if isinstance(spokes, list) else [], skipped, start)


def to_jobs(
    records: Sequence[Mapping[str, Any]], since: float, now: float, resume: bool = True
) -> tuple[list[Job], Counter[str], float]:
    """Jobs of the workloads submitted at or after `since`, submit times from the first; what
    was skipped; and when the first was submitted (epoch s; `since` when none was). `resume`:
    as `run_time`'s."""
    skipped: Counter[str] = Counter()
    rows: list[tuple[float, str, float, Mapping[str, Any]]] = []
    for record in records:
        submitted = float(record["submitted_at"])
        if submitted < since:
            continue
        ran = run_time(record, now, resume)
        if ran is None:
            skipped["never_started"] += 1
            continue
        rows.append((submitted, str(record["id"]), max(1.0, ran), record["spec"]))
    rows.sort(key=lambda r: (r[0], r[1]))
    if not rows:
        return [], skipped, since
    first = rows[0][0]
    jobs = [
        Job(
            id=wid,
            submit=submitted - first,
            duration=duration,
            team=str(spec["team"]),
            nodes=int(spec.get("nodes", 1)),
            gpus_per_node=int(spec.get("gpus_per_node", 1)),
            fraction=spec.get("gpu_fraction"),
            gpu_models=tuple(spec.get("gpu_models") or ()),
            priority=str(spec.get("priority_class", "training")),
        )
        for submitted, wid, duration, spec in rows
    ]
    return jobs, skipped, first


def run_time(record: Mapping[str, Any], now: float, resume: bool = True) -> float | None:
    """Seconds `record` ran: where a stopped job goes on from where it was (`resume`, as
    `--on-preempt resume` replays it), every attempt's run added up, as the API's `run_s`
    counts them; else the last attempt that started (it ran again from the start), until
    `now` while it runs. None when no attempt started.

    Not the record's `started_at`/`finished_at`: they are its latest attempt's, and a workload
    that ran and now waits again has none (it was skipped as never started).
    """
    if resume:
        ran = record.get("run_s")
        return None if ran is None else float(ran)
    started = [a for a in record.get("attempts") or () if a.get("started_at") is not None]
    if not started:
        return None
    last = started[-1]
    end = now if last.get("ended_at") is None else float(last["ended_at"])
    return end - float(last["started_at"])


def fleet_from_spokes(spokes: Sequence[Mapping[str, Any]]) -> Fleet:
    """The fleet as `GET /v1/spokes` describes it: per spoke and model, nodes of equal size.

    The API gives each spoke's node count and GPUs per model; a spoke whose GPUs do not split
    evenly over its nodes (mixed node sizes) needs `--fleet` instead.
    """
    out = []
    for spoke in spokes:
        gpus: Mapping[str, Mapping[str, float]] = spoke.get("gpus") or {}
        count = int(spoke.get("nodes") or 0)
        if not gpus or count <= 0:
            continue
        if len(gpus) != 1 or int(next(iter(gpus.values()))["total"]) % count:
            raise HubFetchError(
                f"spoke {spoke['id']} has mixed nodes ({count} nodes, GPUs {dict(gpus)}): "
                "describe the fleet with --fleet"
            )
        ((model, entry),) = gpus.items()
        per_node = int(entry["total"]) // count
        kind = SpokeKind(spoke.get("kind", "onprem"))
        nodes = tuple(NodeSpec(f"{spoke['id']}-{i}", model, per_node) for i in range(count))
        out.append(SpokeSpec(str(spoke["id"]), str(spoke.get("region", "")), kind, nodes))
    if not out:
        raise HubFetchError("the hub reports no spoke with GPUs: describe the fleet with --fleet")
    return Fleet(tuple(out))
