"""Pure burst decisions: plain data in, a plan out. No I/O, no clock, no random ids."""

from burst.core.model import (
    BurstPlan,
    BurstPolicy,
    CloudInstance,
    Launch,
    MarketPreference,
    Offer,
    OfferCatalog,
    OfferKey,
    PlannerState,
    Skip,
    SkipReason,
    TeamBudget,
    Terminate,
    TerminateReason,
)
from burst.core.planner import plan_burst
from burst.core.state import accrue_spend, commit_plan, record_capacity_error

__all__ = [
    "BurstPlan",
    "BurstPolicy",
    "CloudInstance",
    "Launch",
    "MarketPreference",
    "Offer",
    "OfferCatalog",
    "OfferKey",
    "PlannerState",
    "Skip",
    "SkipReason",
    "TeamBudget",
    "Terminate",
    "TerminateReason",
    "accrue_spend",
    "commit_plan",
    "plan_burst",
    "record_capacity_error",
]
