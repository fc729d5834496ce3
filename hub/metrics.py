"""The hub's Prometheus metrics, served on the API port at `/metrics`.

Two kinds: events counted as they happen (placements, preemptions, requeues, rejections,
dropped messages) and timed (queue waits, scheduling cycles), and state read from the hub's
memory at scrape time (queue depth, GPUs per spoke, leases, burst instances, spend). Each hub
has its own registry, so several hubs in one process (the tests) never share a series.

Labels are bounded: team, priority class, reason code, spoke, GPU model, state. Workload ids
never become labels (docs/observability.md lists every family).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from bus.metric_families import Spec, build, counter, describe, gauge, nats_reconnects
from hub.core.policy import Policy
from hub.records import SpokeRecord, WorkloadRecord
from hub.usage import InstanceBill, team_cost
from schemas import CapacityReport, Phase
from schemas.burst import InstanceEvent, InstanceState

#: Queue waits: seconds to hours.
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
#: Scheduling cycles: a millisecond to ten seconds.
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Why a workload went back to the queue (the hub's history event names).
REQUEUE_REASONS = ("preempted", "spoke_lost", "lost_on_spoke", "failed", "rejected")
#: Why a message was dropped: it did not parse, it claimed another spoke's identity, or it
#: belonged to a superseded assignment.
DROP_REASONS = ("malformed", "forged", "stale")
#: Where a refusal came from: the submission was invalid, or a spoke refused a placement.
REJECTION_SOURCES = ("submit", "spoke")
LEASE_STATES = ("ready", "suspect", "lost")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HubView(Protocol):
    """What the state collector reads from the hub (its in-memory view)."""

    @property
    def policy(self) -> Policy: ...

    @property
    def workloads(self) -> Mapping[str, WorkloadRecord]: ...

    @property
    def fleet(self) -> Mapping[str, SpokeRecord]: ...

    @property
    def instances(self) -> Mapping[str, InstanceEvent]: ...

    @property
    def cordons(self) -> Mapping[str, object]: ...

    @property
    def bills(self) -> Mapping[str, InstanceBill]: ...

    def clock(self) -> float: ...

    def lease_state(self, spoke: SpokeRecord, now: float) -> str: ...

    def nats_reconnects(self) -> int: ...


class HubMetrics:
    """The hub's registry and the metrics its handlers update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_wait = Histogram(
            "gpufed_queue_wait_seconds",
            "Time from entering the queue (submission or requeue) to running.",
            ["priority_class"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.cycle_duration = Histogram(
            "gpufed_cycle_duration_seconds",
            "Duration of one scheduling cycle (snapshot, plan, persist, publish).",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.placements = Counter("gpufed_placements", "Workloads placed on a spoke.", registry=r)
        self.preemptions = Counter(
            "gpufed_preemptions", "Running workloads asked to stop for other work.", registry=r
        )
        self.requeues = Counter(
            "gpufed_requeues", "Workloads sent back to the queue, by why.", ["reason"], registry=r
        )
        self.rejections = Counter(
            "gpufed_rejections",
            "Refusals: invalid submissions and placements a spoke refused.",
            ["source"],
            registry=r,
        )
        self.dropped = Counter(
            "gpufed_messages_dropped",
            "Messages dropped: malformed, forged (identity does not match the subject), stale.",
            ["reason"],
            registry=r,
        )
        self.removed = Counter(
            "gpufed_workloads_removed",
            "Ended workloads removed from the store once kept their time (--keep-ended).",
            registry=r,
        )
        self.store_unavailable = Counter(
            "gpufed_store_unavailable",
            "Store calls that failed for the store's own sake (its disk, its server): each"
            " request among them answered 503 store_unavailable.",
            registry=r,
        )
        self._queue_waits: dict[str, Histogram] = {}
        for reason in REQUEUE_REASONS:
            self.requeues.labels(reason)
        for source in REJECTION_SOURCES:
            self.rejections.labels(source)
        for reason in DROP_REASONS:
            self.dropped.labels(reason)

    def waited(self, priority_class: str, seconds: float) -> None:
        """A workload ran after `seconds` in the queue (the child per class kept: `labels()`
        takes a lock and builds its key on every call, once per workload started)."""
        child = self._queue_waits.get(priority_class)
        if child is None:
            child = self._queue_waits[priority_class] = self.queue_wait.labels(priority_class)
        child.observe(seconds)

    def attempt_ended(self, reason: str, requeued: bool) -> None:
        """Count an attempt's end: a requeue by why, a spoke's refusal as a rejection."""
        if requeued:
            self.requeues.labels(reason).inc()
        if reason == "rejected":
            self.rejections.labels("spoke").inc()

    def bind(self, view: HubView) -> None:
        """Export `view`'s state on every scrape."""
        self.registry.register(StateCollector(view))

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


class StateCollector(Collector):
    """Gauges computed from the hub's memory when Prometheus scrapes."""

    def __init__(self, view: HubView) -> None:
        self.view = view

    def describe(self) -> Iterable[Metric]:
        return describe(_SPECS)

    def collect(self) -> Iterable[Metric]:
        view = self.view
        now = view.clock()
        f = build(_SPECS)
        queue: dict[tuple[str, str, str], int] = defaultdict(int)
        oldest: dict[str, float] = {}
        phases: dict[str, int] = defaultdict(int)
        for w in view.workloads.values():
            phases[w.phase.value] += 1
            if w.phase != Phase.QUEUED:
                continue
            reason = w.reason or "not_considered_yet"
            queue[(w.spec.team, w.spec.priority_class, reason)] += 1
            oldest[w.spec.team] = max(oldest.get(w.spec.team, 0.0), now - w.submitted_at)
        for key, count in sorted(queue.items()):
            f["queue"].add_metric(list(key), count)
        for team, age in sorted(oldest.items()):
            f["oldest"].add_metric([team], age)
        for phase in (Phase.QUEUED, Phase.PLACED, Phase.RUNNING):
            f["workloads"].add_metric([phase.value], phases.get(phase.value, 0))
        models: dict[tuple[str, str], str] = {}
        for spoke in view.fleet.values():
            state = view.lease_state(spoke, now)
            for lease in LEASE_STATES:
                f["lease"].add_metric([spoke.id, lease], 1.0 if lease == state else 0.0)
            f["seen"].add_metric([spoke.id], max(0.0, now - spoke.last_seen))
            if spoke.report is not None and state != "lost":
                on_offer = spoke.id not in view.cordons
                for model, total, allocated, free in gpu_counts(spoke.report, on_offer):
                    f["capacity"].add_metric([spoke.id, model], total)
                    f["allocated"].add_metric([spoke.id, model], allocated)
                    f["free"].add_metric([spoke.id, model], free)
            for node in spoke.report.nodes if spoke.report else ():
                models[(spoke.id, node.name)] = node.gpu_model
        for (team, model), gpus in sorted(team_gpus(view.workloads.values(), models).items()):
            f["team_alloc"].add_metric([team, model], gpus)
        for team, model, guaranteed in guarantees(view.policy):
            f["team_guar"].add_metric([team, model], guaranteed)
        states: dict[str, int] = defaultdict(int)
        for instance in view.instances.values():
            states[instance.state.value] += 1
        for state in InstanceState:
            f["instances"].add_metric([state.value], states.get(state.value, 0))
        for team, dollars in sorted(team_cost(view.bills.values(), now).items()):
            f["spend"].add_metric([team], dollars)
        f["reconnects"].add_metric([], view.nats_reconnects())
        yield from f.values()


def gpu_counts(
    report: CapacityReport, on_offer: bool = True
) -> list[tuple[str, float, float, float]]:
    """(model, total, allocated, free) per GPU model of a spoke's report.

    Free GPUs are those on offer (none of a spoke not `on_offer`, cordoned or lost; a
    cordoned node's idle GPUs neither); allocated ones are held by work or by something
    outside gpufed.
    """
    out: dict[str, list[float]] = {}
    for node in report.nodes:
        entry = out.setdefault(node.gpu_model, [0.0, 0.0, 0.0])
        idle = len(node.free_devices) + sum(node.device_free_fraction.values())
        entry[0] += node.gpu_count
        entry[1] += max(0.0, node.gpu_count - idle)
        entry[2] += idle if node.schedulable and on_offer else 0.0
    return [(model, v[0], v[1], v[2]) for model, v in sorted(out.items())]


def team_gpus(
    workloads: Iterable[WorkloadRecord], node_models: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], float]:
    """GPUs held now per (team, GPU model), from the assignments of placed and running work."""
    held: dict[tuple[str, str], float] = defaultdict(float)
    for w in workloads:
        if not w.phase.active or w.spoke_id is None:
            continue
        for a in w.assignments:
            model = node_models.get((w.spoke_id, a.node), "unknown")
            share = a.fraction if a.fraction is not None else 1.0
            held[(w.spec.team, model)] += len(a.devices) * share
    return dict(held)


def guarantees(policy: Policy) -> Iterator[tuple[str, str, float]]:
    """(team, GPU model, guaranteed GPUs) for every team the policy names."""
    for team in policy.teams:
        for model, quota in sorted(team.quotas.items()):
            yield team.name, model, quota.guaranteed


_SPECS: dict[str, Spec] = {
    "queue": gauge(
        "gpufed_queue_workloads",
        "Workloads waiting, by team, priority class and the reason they wait.",
        "team priority_class reason",
    ),
    "oldest": gauge(
        "gpufed_queue_oldest_age_seconds",
        "Age of each team's oldest waiting workload.",
        "team",
    ),
    "workloads": gauge("gpufed_workloads", "Non-terminal workloads by phase.", "phase"),
    "capacity": gauge("gpufed_gpus_capacity", "GPUs a spoke has.", "spoke gpu_model"),
    "allocated": gauge("gpufed_gpus_allocated", "GPUs in use on a spoke.", "spoke gpu_model"),
    "free": gauge("gpufed_gpus_free", "GPUs on offer on a spoke.", "spoke gpu_model"),
    "lease": gauge(
        "gpufed_spoke_lease",
        "1 for the state a spoke's lease is in (ready, suspect, lost), else 0.",
        "spoke state",
    ),
    "seen": gauge(
        "gpufed_spoke_last_report_age_seconds",
        "Seconds since the spoke's last capacity report.",
        "spoke",
    ),
    "team_alloc": gauge(
        "gpufed_team_gpus_allocated",
        "GPUs a team's placed and running work holds.",
        "team gpu_model",
    ),
    "team_guar": gauge(
        "gpufed_team_gpus_guaranteed",
        "GPUs the policy guarantees a team ('*' is any model).",
        "team gpu_model",
    ),
    "instances": gauge(
        "gpufed_burst_instances",
        "Cloud instances rented by burst, by state.",
        "state",
    ),
    "spend": counter(
        "gpufed_cloud_spend_dollars",
        "Dollars billed for burst instances (boot, idle and busy time), by the team whose demand "
        "launched them.",
        "team",
    ),
    "reconnects": nats_reconnects("Times the hub's NATS connection was re-established."),
}
