"""The burst controller's Prometheus metrics, served on `--metrics-port` at `/metrics`.

Read from the controller at scrape time: instances by state, the $/h the live fleet costs and
the limits it is held to, and what each team has spent against its total budget (so an alert
can fire at 80 %).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from burst.service import BurstController
from bus.metric_families import Spec, build, counter, describe, gauge, nats_reconnects
from schemas.burst import InstanceState


class BurstMetrics(Collector):
    """Exports one controller's state."""

    def __init__(self, controller: BurstController) -> None:
        self.controller = controller
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def describe(self) -> Iterable[Metric]:
        return describe(_SPECS)

    def collect(self) -> Iterable[Metric]:
        f = build(_SPECS)
        c = self.controller
        provider = c.provider.name
        states: dict[str, int] = defaultdict(int)
        team_rate: dict[str, float] = defaultdict(float)
        for record in c.fleet.values():
            states[record.state.value] += 1
            if record.state.active:
                team_rate[record.event.team] += record.event.price_per_hour
        for state in InstanceState:
            f["instances"].add_metric([provider, state.value], states.get(state.value, 0))
        f["rate"].add_metric([provider], sum(team_rate.values()))
        for team, rate in sorted(team_rate.items()):
            f["team_rate"].add_metric([provider, team], rate)
        if c.policy.max_dollars_per_hour is not None:
            f["max_rate"].add_metric([provider], c.policy.max_dollars_per_hour)
        if c.policy.max_instances is not None:
            f["max_instances"].add_metric([provider], c.policy.max_instances)
        for team, dollars in sorted(c.planner_state.team_spend.items()):
            f["spend"].add_metric([provider, team], dollars)
        for team, budget in sorted(c.policy.team_budgets.items()):
            if budget.dollars_total is not None:
                f["budget"].add_metric([provider, team], budget.dollars_total)
            if budget.dollars_per_hour is not None:
                f["team_max_rate"].add_metric([provider, team], budget.dollars_per_hour)
        f["rounds"].add_metric([provider], c.rounds)
        f["reconnects"].add_metric([provider], c.bus.reconnects)
        yield from f.values()


_SPECS: dict[str, Spec] = {
    "instances": gauge(
        "gpufed_burst_controller_instances",
        "Instances the controller tracks, by state.",
        "provider state",
    ),
    "rate": gauge(
        "gpufed_burst_spend_rate_dollars_per_hour",
        "What the live instances (booting, running, terminating) cost per hour.",
        "provider",
    ),
    "team_rate": gauge(
        "gpufed_burst_team_spend_rate_dollars_per_hour",
        "What a team's live instances cost per hour.",
        "provider team",
    ),
    "max_rate": gauge(
        "gpufed_burst_max_dollars_per_hour",
        "The $/h the whole burst fleet may cost (absent: no limit).",
        "provider",
    ),
    "max_instances": gauge(
        "gpufed_burst_max_instances",
        "Live instances allowed at once (absent: no limit).",
        "provider",
    ),
    "spend": counter(
        "gpufed_burst_team_spend_dollars",
        "Dollars accrued by a team's instances since the controller started.",
        "provider team",
    ),
    "budget": gauge(
        "gpufed_burst_team_budget_dollars",
        "A team's total burst budget: no launch once it is spent.",
        "provider team",
    ),
    "team_max_rate": gauge(
        "gpufed_burst_team_max_dollars_per_hour",
        "The $/h a team's live instances may cost.",
        "provider team",
    ),
    "rounds": counter("gpufed_burst_rounds", "Planning rounds run.", "provider"),
    "reconnects": nats_reconnects("Times the NATS connection was re-established.", "provider"),
}
