"""Scheduling policy: priority classes, teams, departments, quotas, fair share and aging.

Plain frozen data the placement core decides with; `hub.policyfile` reads it from YAML/JSON and
`check_policy` lists what is wrong with one (the loader refuses a policy with problems).

Choices worth knowing (docs/policy.md explains them for users):

- **No teams means no quotas.** `Policy()` admits everything that fits (only priorities, fair
  share and aging apply).
- **Unknown teams** (a workload's team is not listed while the policy lists teams) get
  `default_team`'s settings. A policy *document* (`hub.policyfile`, and so every hub) gives
  them no guarantee, unlimited borrowing, weight 1, at most DEFAULT_MAX_QUEUED queued and no
  cloud burst: a made-up team name must not rent instances. `Policy()` itself, the core's
  "no policy", restricts nothing.
- **Quotas are per GPU model.** A quota entry keyed `"*"` applies to every model not listed; a
  model with no entry and no `"*"` has no guarantee and no limit.
- **Departments share a quota.** A department's `guaranteed` includes its teams' own guarantees;
  what is left over is a pool any member may use as guaranteed capacity. Its `limit` caps the
  members' usage together.
- **Classes that are never preempted never borrow**: work that cannot be reclaimed must run
  within guarantees, otherwise a guarantee could not be honoured.
- **Time windows** (`Window`) change classes, teams and departments on a weekly schedule in a
  named time zone; `hub.core.windows.policy_at(policy, now)` is the policy in force at `now`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import TypeVar

from hub.core.idle import IdleRules, SessionRules

#: Default priority values, highest first.
DEFAULT_PRIORITIES: Mapping[str, int] = {
    "production": 1000,
    "training": 500,
    "dev": 300,
    "batch": 100,
}

#: Quota key that applies to every GPU model without its own entry.
ANY_MODEL = "*"

#: Bounds on a policy's numbers: each keeps the scheduler's arithmetic finite (an aging interval
#: of 5e-324 s made every cycle overflow; a weight of 1e-320 divides to infinity).
MIN_AGING_INTERVAL_S = 1.0
MAX_AGING_INTERVAL_S = 365 * 24 * 3600.0
MAX_PRIORITY = 1_000_000
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1_000_000.0
MAX_GPUS = 1_000_000.0


@dataclass(frozen=True, slots=True)
class Quota:
    """GPUs of one model: `guaranteed` is reclaimable on demand, `limit` caps all use.

    `limit=None` means no cap beyond what is idle. Both count fractional GPUs as their share.
    """

    guaranteed: float = 0.0
    limit: float | None = None


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority. Higher `value` is placed first and may evict lower (same team)."""

    name: str
    value: int
    preemptible: bool = True
    may_borrow: bool = True


DEFAULT_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("production", 1000, preemptible=False, may_borrow=False),
    PriorityClass("training", 500),
    PriorityClass("dev", 300),
    PriorityClass("batch", 100),
)


@dataclass(frozen=True, slots=True)
class Department:
    """A group of teams sharing one quota per GPU model."""

    name: str
    quotas: Mapping[str, Quota] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Team:
    """Who submits work: quotas per GPU model, a fair-share weight, whether it may burst."""

    name: str
    department: str | None = None
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    weight: float = 1.0
    may_burst: bool = False
    max_queued: int | None = None
    burst_dollars_per_hour: float | None = None
    burst_dollars_per_month: float | None = None


#: Queued workloads a team may have at once when the policy says nothing (429 beyond).
DEFAULT_MAX_QUEUED = 5000
#: What all burst instances together may cost per hour when the policy says nothing.
DEFAULT_BURST_DOLLARS_PER_HOUR = 50.0


@dataclass(frozen=True, slots=True)
class BurstBudget:
    """Spend limits of cloud burst, enforced by the burst controller (None: no limit).

    `dollars_per_hour` caps the hourly price of all live instances together; each team's
    `burst_dollars_per_hour` caps its own instances, `burst_dollars_per_month` what it may
    accrue in a calendar month (UTC).
    """

    dollars_per_hour: float | None = DEFAULT_BURST_DOLLARS_PER_HOUR


@dataclass(frozen=True, slots=True)
class Aging:
    """Waiting raises a workload's queue priority by `step` every `interval_s` seconds.

    Aged priority never reaches the lowest non-preemptible class (production), and it only
    changes queue order: preemption compares the classes' own values, so waiting never lets
    work evict anything.
    """

    interval_s: float = 900.0
    step: int = 25


@dataclass(frozen=True, slots=True)
class ClassChange:
    """What a time window changes in a priority class; None keeps the class's own setting."""

    value: int | None = None
    preemptible: bool | None = None
    may_borrow: bool | None = None


@dataclass(frozen=True, slots=True)
class TeamChange:
    """What a time window changes in a team: quotas model by model, weight, burst."""

    quotas: Mapping[str, Quota] = field(default_factory=dict)
    weight: float | None = None
    may_burst: bool | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """Changes to the policy in force every week on `days` from `start_s` to `end_s`.

    Times are seconds after local midnight in `zone` (wall-clock time, so a window keeps its
    hours across daylight-saving changes). `end_s` may be 86400 (midnight at the end of the
    day); an `end_s` not after `start_s` means the window runs past midnight into the next day.
    `days` are weekdays (Monday 0) on which the window *starts*.
    """

    name: str
    zone: tzinfo
    timezone: str = "UTC"
    days: frozenset[int] = frozenset(range(7))
    start_s: int = 0
    end_s: int = 86400
    classes: Mapping[str, ClassChange] = field(default_factory=dict)
    teams: Mapping[str, TeamChange] = field(default_factory=dict)
    departments: Mapping[str, Mapping[str, Quota]] = field(default_factory=dict)
    default_team: TeamChange | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """Wide gangs are not starved by the small jobs that keep taking the GPUs freed for them.

    A whole-GPU workload of at least `min_gpus` GPUs that has waited `after_s` and does not fit
    holds the nodes it would need on the on-prem spoke closest to fitting it (the nodes with
    the most free GPUs): for the rest of the plan, nothing else is placed on their free
    devices, so they fill up for it as the work on them ends. At most `max_gangs` gangs hold
    nodes per plan (the oldest first, in queue order). `min_gpus` 0 (the default) turns it off:
    on the Philly replay, holding nodes without run-time estimates cut wide gangs' p99 wait by
    only 13 % at load factor 5 and made it worse on a slice (docs/replay.md).
    """

    min_gpus: int = 0
    after_s: float = 1800.0
    max_gangs: int = 1


@dataclass(frozen=True, slots=True)
class Ordering:
    """How borrowed GPUs are shared out (`hub.core.ordering`).

    `fifo`: within a priority band, fair share, then submission order. `las` (Tiresias 2D-LAS):
    a workload's attained service (GPU-seconds run so far) puts it in a level, one past every
    threshold in `thresholds_gpu_s` it has passed; lower levels go first, and a workload may
    take another team's borrowed GPUs from running work of a higher level (of its own priority
    class or lower, never a gang of `exempt_gpus` GPUs or more) as long as that team keeps its
    guarantee. A workload that waited `promote_knob` times as long as it ran goes back to level
    0 (Tiresias' starvation guard). Work is taken only once it has run `min_run_s` since it
    last started, so resumed work is not stopped again at once (work that ran before, in an
    earlier attempt, only after `resumed_min_run_s` if that is longer: 1e9 stops a job for LAS
    at most once), and only for a workload submitted at least `patience_s` ago: until then it
    waits for GPUs to free up by themselves.
    """

    mode: str = "fifo"
    thresholds_gpu_s: tuple[float, ...] = (3600.0,)
    promote_knob: float = 8.0
    exempt_gpus: int = 32
    min_run_s: float = 0.0
    patience_s: float = 0.0
    resumed_min_run_s: float = 0.0


ORDERING_MODES = ("fifo", "las")


@dataclass(frozen=True, slots=True)
class Consolidation:
    """Bringing work that runs on a cloud spoke back on-prem (`hub.core.consolidate`).

    When `enabled`, a plan that leaves on-prem GPUs free (after placing and holding for every
    pending workload it could) stops up to `max_per_cycle` preemptible jobs that have run at
    least `after_s` on a cloud spoke and fit those GPUs: they checkpoint, are queued again,
    and go on-prem; the emptied instance is released by burst's idle_ttl.
    """

    enabled: bool = False
    after_s: float = 7200.0
    max_per_cycle: int = 4


@dataclass(frozen=True, slots=True)
class Policy:
    """Global policy the placement core decides with.

    `windows` change it on a schedule; the first window in force wins. The cores decide with
    `hub.core.windows.policy_at(policy, now)`, which has the changes applied and no windows.
    `window` names the window such a policy was made for (None: none was in force).
    """

    classes: tuple[PriorityClass, ...] = DEFAULT_CLASSES
    teams: tuple[Team, ...] = ()
    departments: tuple[Department, ...] = ()
    default_team: Team = field(default_factory=lambda: Team(name="*", may_burst=True))
    aging: Aging = field(default_factory=Aging)
    windows: tuple[Window, ...] = ()
    window: str | None = None
    reservation: Reservation = field(default_factory=Reservation)
    ordering: Ordering = field(default_factory=Ordering)
    burst: BurstBudget = field(default_factory=BurstBudget)
    sessions: SessionRules = field(default_factory=SessionRules)
    idle: IdleRules = field(default_factory=IdleRules)
    consolidation: Consolidation = field(default_factory=Consolidation)
    _classes: Mapping[str, PriorityClass] = field(init=False, repr=False, compare=False)
    _teams: Mapping[str, Team] = field(init=False, repr=False, compare=False)
    _departments: Mapping[str, Department] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Indexes for O(1) look-ups; on duplicates the first entry wins (check_policy says so).
        object.__setattr__(self, "_classes", _index(self.classes))
        object.__setattr__(self, "_teams", _index(self.teams))
        object.__setattr__(self, "_departments", _index(self.departments))

    @property
    def priorities(self) -> Mapping[str, int]:
        """Priority class values by name."""
        return {c.name: c.value for c in self.classes}

    @property
    def has_quotas(self) -> bool:
        """False when nothing limits anyone: no teams, no departments, no default quotas."""
        return bool(self.teams or self.departments or self.default_team.quotas)

    def priority(self, class_name: str) -> int:
        """Value of a priority class; unknown classes rank lowest."""
        cls = self._classes.get(class_name)
        return cls.value if cls is not None else 0

    def priority_class(self, class_name: str) -> PriorityClass | None:
        """The class named `class_name`, or None when the policy does not define it."""
        return self._classes.get(class_name)

    def team(self, name: str) -> Team:
        """The team's settings; unlisted teams get `default_team`'s."""
        team = self._teams.get(name)
        return team if team is not None else self.default_team

    def max_queued(self, team: str) -> int | None:
        """How many queued workloads `team` may have (its own cap, else the default team's)."""
        own = self._teams.get(team)
        if own is not None and own.max_queued is not None:
            return own.max_queued
        return self.default_team.max_queued

    def department(self, name: str | None) -> Department | None:
        """The department named `name` (None for none or unknown)."""
        return self._departments.get(name) if name is not None else None

    def aging_cap(self) -> int:
        """Highest queue priority aging may give: just below the lowest never-preempted class."""
        fixed = [c.value for c in self.classes if not c.preemptible]
        if fixed:
            return min(fixed) - 1
        return max((c.value for c in self.classes), default=0)


_Named = TypeVar("_Named", PriorityClass, Team, Department)


def quota_for(quotas: Mapping[str, Quota], model: str) -> Quota | None:
    """The quota entry for `model`: its own, else the `"*"` entry, else None (unlimited)."""
    quota = quotas.get(model)
    if quota is None:
        quota = quotas.get(ANY_MODEL)
    return quota


def check_policy(policy: Policy) -> list[str]:
    """Every problem with `policy`, each as "field path: what is wrong"; empty when valid."""
    problems: list[str] = []
    if not policy.classes:
        problems.append("priority_classes: at least one class is needed")
    problems += _duplicates("priority_classes", [c.name for c in policy.classes])
    problems += _duplicates("teams", [t.name for t in policy.teams])
    problems += _duplicates("departments", [d.name for d in policy.departments])
    for cls in policy.classes:
        where = f"priority_classes[{cls.name}]"
        if cls.name == "production" and cls.preemptible:
            problems.append(f"{where}.preemptible: production work is never preempted")
        if not cls.preemptible and cls.may_borrow:
            problems.append(
                f"{where}.may_borrow: a class that is never preempted cannot borrow, "
                "or borrowed GPUs could never be reclaimed for a team's guarantee"
            )
    for dept in policy.departments:
        problems += _quota_problems(f"departments[{dept.name}]", dept.quotas)
    for team in (*policy.teams, policy.default_team):
        where = "default_team" if team is policy.default_team else f"teams[{team.name}]"
        if not MIN_WEIGHT <= team.weight <= MAX_WEIGHT:
            problems.append(
                f"{where}.weight: must be between {MIN_WEIGHT:g} and {MAX_WEIGHT:g}, "
                f"got {team.weight:g}"
            )
        problems += _quota_problems(where, team.quotas)
        if team.department is not None and policy.department(team.department) is None:
            problems.append(f"{where}.department: unknown department {team.department!r}")
    problems += _department_guarantees(policy)
    if not MIN_AGING_INTERVAL_S <= policy.aging.interval_s <= MAX_AGING_INTERVAL_S:
        problems.append(
            f"aging.interval_s: must be between {MIN_AGING_INTERVAL_S:g} and "
            f"{MAX_AGING_INTERVAL_S:g} seconds, got {policy.aging.interval_s:g}"
        )
    if not 0 <= policy.aging.step <= MAX_PRIORITY:
        problems.append(f"aging.step: must be between 0 and {MAX_PRIORITY}")
    problems += _ordering_problems(policy.ordering)
    rule = policy.consolidation
    if not 0 <= rule.after_s <= 1e9:
        problems.append("consolidation.after_s: must be between 0 and 1e9 seconds")
    if not 0 <= rule.max_per_cycle <= 10_000:
        problems.append("consolidation.max_per_cycle: must be between 0 and 10000")
    for cls in policy.classes:
        if not -MAX_PRIORITY <= cls.value <= MAX_PRIORITY:
            problems.append(
                f"priority_classes[{cls.name}].value: must be between -{MAX_PRIORITY} and "
                f"{MAX_PRIORITY}"
            )
    return problems


def _ordering_problems(ordering: Ordering) -> list[str]:
    problems = []
    if ordering.mode not in ORDERING_MODES:
        problems.append(f"ordering.mode: must be one of {', '.join(ORDERING_MODES)}")
    steps = ordering.thresholds_gpu_s
    if any(not 0 < t <= MAX_GPUS * 3.2e7 for t in steps) or list(steps) != sorted(set(steps)):
        problems.append("ordering.thresholds_gpu_s: positive GPU-seconds in increasing order")
    if not 0 <= ordering.promote_knob <= 1e6:
        problems.append("ordering.promote_knob: must be between 0 (never) and 1000000")
    if not 0 <= ordering.min_run_s <= 1e9:
        problems.append("ordering.min_run_s: must be between 0 and 1e9 seconds")
    if not 0 <= ordering.patience_s <= 1e9:
        problems.append("ordering.patience_s: must be between 0 and 1e9 seconds")
    if not 0 <= ordering.resumed_min_run_s <= 1e9:
        problems.append("ordering.resumed_min_run_s: must be between 0 and 1e9 seconds")
    if ordering.exempt_gpus < 0:
        problems.append("ordering.exempt_gpus: must not be negative")
    return problems


def _index(items: tuple[_Named, ...]) -> dict[str, _Named]:
    index: dict[str, _Named] = {}
    for item in items:
        index.setdefault(item.name, item)
    return index


def _duplicates(where: str, names: list[str]) -> list[str]:
    seen: set[str] = set()
    problems = []
    for name in names:
        if name in seen:
            problems.append(f"{where}[{name}]: defined more than once")
        seen.add(name)
    return problems


def _quota_problems(where: str, quotas: Mapping[str, Quota]) -> list[str]:
    problems = []
    for model, quota in quotas.items():
        at = f"{where}.quotas[{model}]"
        if not 0 <= quota.guaranteed <= MAX_GPUS:
            problems.append(
                f"{at}.guaranteed: must be between 0 and {MAX_GPUS:g}, got {quota.guaranteed:g}"
            )
        if quota.limit is not None and not quota.limit <= MAX_GPUS:
            problems.append(f"{at}.limit: must be at most {MAX_GPUS:g}, got {quota.limit:g}")
        if quota.limit is not None and quota.limit < quota.guaranteed:
            problems.append(
                f"{at}.limit: {quota.limit:g} is below the guaranteed {quota.guaranteed:g}"
            )
    return problems


def _department_guarantees(policy: Policy) -> list[str]:
    """Team guarantees are carved out of their department's; they may not add up to more."""
    problems = []
    for dept in policy.departments:
        members = [t for t in policy.teams if t.department == dept.name]
        models = {m for t in members for m in t.quotas} | set(dept.quotas)
        for model in sorted(models):
            dept_quota = quota_for(dept.quotas, model)
            if dept_quota is None:
                continue
            total = sum((q.guaranteed for t in members if (q := quota_for(t.quotas, model))), 0.0)
            if total > dept_quota.guaranteed + 1e-9:
                problems.append(
                    f"departments[{dept.name}].quotas[{model}].guaranteed: "
                    f"{dept_quota.guaranteed:g} is less than its teams' guarantees ({total:g})"
                )
    return problems
