"""Quota accounting: who uses how many GPUs of which model, and what they may still take.

Usage counts GPUs per team and GPU model, running plus placed this cycle (a fraction counts as
its share). Running work that is being preempted still counts against limits (its devices are
not free yet) but no longer fills guarantees (it is on its way out).

Guarantees fill in order of priority, highest first: a team's own guarantee first, then its
department's shared pool (the department guarantee minus its teams' own guarantees). So the
guaranteed room a workload sees counts only work of its own priority or higher; what
lower-priority work holds beyond that is borrowed (see `hub.core.victims`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hub.core.capacity import EPS
from hub.core.model import Reason
from hub.core.policy import Policy, PriorityClass, Quota, quota_for

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Block:
    """Why quota refuses a workload, for the person who submitted it."""

    reason: Reason
    message: str


class _Account:
    """One team's use of one GPU model: what a ledger reads of it, in one object."""

    __slots__ = ("booked", "filled", "limits", "lowest", "shared", "used")

    def __init__(self) -> None:
        self.used = 0.0  # GPUs held, stopping work included
        self.filled: dict[int, float] = {}  # class value -> GPUs, stopping work excluded
        self.lowest: int | None = None  # the lowest class value with GPUs in `filled`
        self.booked = False  # anything was added (its share reads this model)
        # its own quota, its department and the department's quota (`Ledger._limits`)
        self.limits: tuple[Quota, str | None, Quota | None] | None = None
        self.shared: _Shared | None = None  # its department's use of the model


class _Shared:
    """A department's use of one GPU model."""

    __slots__ = ("members", "used")

    def __init__(self) -> None:
        self.used = 0.0
        self.members: dict[str, None] = {}  # its teams that hold some, in a fixed order


class Ledger:
    """Usage per team and model, updated as the plan places work.

    Each team's use of a model is one `_Account` (its usage, per-class fill, limits), found by
    team, then model: a plan asks about quota several times per decision, and one object read
    there costs less than a lookup per figure by a (team, model) key made each time.
    """

    def __init__(self, policy: Policy, totals: dict[str, float]) -> None:
        self.policy = policy
        self.limited = policy.has_quotas
        self.totals = totals
        self._accounts: dict[str, dict[str, _Account]] = {}  # team -> model -> its account
        self._departments: dict[str, dict[str, _Shared]] = {}  # department -> model -> use
        # team -> its weight and, per model it uses, (its account, GPUs of the model, its own
        # guarantee): what a share reads besides usage, until the team uses another model
        self._share_terms: dict[str, tuple[float, list[tuple[_Account, float, float]]]] = {}
        self._pools: dict[tuple[str, str], float] = {}
        # (model, department or None, team outside one or "") -> (team, class value) ->
        # guaranteed room, until an add() that changes it
        self._rooms: dict[tuple[str, str | None, str], dict[tuple[str, int], float]] = {}
        # (team, model, class value) -> the room last computed: no later room is larger
        self._room_bounds: dict[tuple[str, str, int], float] = {}
        self._shares: dict[str, tuple[float, float]] = {}  # team -> share, until its next add()

    def add(
        self, team: str, model: str, amount: float, value: int, *, preempting: bool = False
    ) -> None:
        """Count GPUs a team holds at priority `value` (running, or given this cycle)."""
        self._shares.pop(team, None)  # a share reads only its own team's usage
        dept = self.policy.team(team).department
        if self.limited and not preempting:
            # A room at value v reads the `model` GPUs its team (and its department's teams)
            # hold at v or above: this add changes those at `value` or below.
            rooms = self._rooms.get(_room_group(model, dept, team))
            if rooms:
                for k in [k for k in rooms if k[1] <= value]:
                    del rooms[k]
        self._book(team, model, amount, value, preempting, dept)

    def load(
        self, sums: dict[tuple[str, str, bool, str], float], keys: list[tuple[str, str, bool, str]]
    ) -> None:
        """`add()` each of `keys` (team, model, stopping, class name) with its sum, in order,
        to a ledger nothing was added to yet (no share or room worked out): a plan's running
        work, with each team's department looked up once."""
        priority, team_of = self.policy.priority, self.policy.team
        depts: dict[str, str | None] = {}
        for key in keys:
            team, model, preempting, name = key
            if team in depts:
                dept = depts[team]
            else:
                dept = depts[team] = team_of(team).department
            self._book(team, model, sums[key], priority(name), preempting, dept)

    def _book(
        self, team: str, model: str, amount: float, value: int, preempting: bool, dept: str | None
    ) -> None:
        account = _made(self._accounts, team, model, _Account)
        account.used += amount
        if not account.booked:
            account.booked = True
            self._share_terms.pop(team, None)
        if not self.limited:
            return
        if dept is not None:
            shared = account.shared
            if shared is None:
                shared = account.shared = _made(self._departments, dept, model, _Shared)
            shared.used += amount
            shared.members[team] = None
        if not preempting:
            levels = account.filled
            filled = levels[value] = levels.get(value, 0.0) + amount
            lowest = account.lowest
            if filled > EPS and (lowest is None or value < lowest):
                account.lowest = value  # sums never shrink: a level, once over, stays

    def admit(self, team: str, cls: PriorityClass, model: str, amount: float) -> Block | None:
        """None when quota lets `team` take `amount` more `model` GPUs at class `cls`."""
        if not self.limited:
            return None
        account = _made(self._accounts, team, model, _Account)
        own, dept_name, quota = self._limits(team, model, account)
        used = account.used
        if own.limit is not None and used + amount > own.limit + EPS:
            return Block(
                Reason.TEAM_LIMIT, _limit_message("team", team, model, used, own.limit, amount)
            )
        if quota is not None and quota.limit is not None and dept_name is not None:
            dused = self._dept_used(dept_name, model)
            if dused + amount > quota.limit + EPS:
                return Block(
                    Reason.DEPARTMENT_LIMIT,
                    _limit_message("department", dept_name, model, dused, quota.limit, amount),
                )
        if not cls.may_borrow:
            room = self.room(team, model, cls.value)
            if amount > room + EPS:
                guaranteed = own.guaranteed + self._pool(dept_name, model)
                left = (
                    f"has {room:g} of its {guaranteed:g} guaranteed {model} left for it"
                    if guaranteed > EPS
                    else f"has no guaranteed {model}"
                )
                return Block(
                    Reason.GUARANTEE_EXHAUSTED,
                    f"priority class '{cls.name}' may only use guaranteed GPUs and team {team} "
                    f"{left}, needs {amount:g}",
                )
        return None

    def limit_room(self, team: str, model: str) -> float:
        """GPUs of `model` the team may still take before its own or its department's limit."""
        if not self.limited:
            return INF
        room = INF
        account = _made(self._accounts, team, model, _Account)
        own, dept_name, quota = self._limits(team, model, account)
        if own.limit is not None:
            room = own.limit - account.used
        if quota is not None and quota.limit is not None and dept_name is not None:
            room = min(room, quota.limit - self._dept_used(dept_name, model))
        return room

    def _dept_used(self, dept: str, model: str) -> float:
        shared = _found(self._departments, dept, model)
        return shared.used if shared is not None else 0.0

    def room(self, team: str, model: str, value: int) -> float:
        """Guaranteed `model` GPUs left for work of priority `value`.

        Guarantees fill highest priority first, so only work at `value` or above counts: what
        lower-priority work of the team holds would become borrowed. The team's own guarantee
        first, then its department's pool.
        """
        if not self.limited:
            return 0.0
        dept = self.policy.team(team).department
        group = _room_group(model, dept, team)
        rooms = self._rooms.get(group)
        if rooms is None:
            rooms = self._rooms[group] = {}
        cached = rooms.get((team, value))
        if cached is not None:
            return cached
        own = self._own(team, model).guaranteed
        left = max(0.0, own - self._at_or_above(team, model, value))
        if dept is not None:
            overflow = 0.0  # sum() of max(0.0, ...) per member, in the members' order
            shared = _found(self._departments, dept, model)
            for t in shared.members if shared is not None else ():
                over = self._at_or_above(t, model, value) - self._own(t, model).guaranteed
                if over > 0.0:
                    overflow += over
            left += max(0.0, self._pool(dept, model) - overflow)
        rooms[(team, value)] = left
        self._room_bounds[(team, model, value)] = left
        return left

    def exceeds_room(self, team: str, model: str, value: int, amount: float) -> bool:
        """`amount > room(team, model, value) + EPS`, often without working the room out.

        Adds only ever raise what a room subtracts (float sums of amounts that are never
        negative only grow, in a fixed order), so a room never grows within a plan: an
        amount beyond a room computed earlier is beyond the room now.
        """
        bound = self._room_bounds.get((team, model, value))
        if bound is not None and amount > bound + EPS:
            return True
        return amount > self.room(team, model, value) + EPS

    def share(self, team: str) -> tuple[float, float]:
        """Weighted dominant share: above guarantee first, then of everything used."""
        cached = self._shares.get(team)
        if cached is not None:
            return cached
        terms = self._share_terms.get(team)
        if terms is None:
            terms = self._share_terms[team] = self._terms(team)
        weight, parts = terms
        above = 0.0
        total = 0.0
        for account, cap, guaranteed in parts:  # max() of each, without the calls
            used = account.used
            part = (used - guaranteed) / cap
            if part > above:
                above = part
            part = used / cap
            if part > total:
                total = part
        found = self._shares[team] = (above / weight, total / weight)
        return found

    def _terms(self, team: str) -> tuple[float, list[tuple[_Account, float, float]]]:
        """What `share` reads of the team besides its usage (see `_share_terms`)."""
        parts = []
        for model, account in self._accounts.get(team, {}).items():
            cap = self.totals.get(model, 0.0)
            if account.booked and cap > 0:
                guaranteed = self._own(team, model).guaranteed if self.limited else 0.0
                parts.append((account, cap, guaranteed))
        return self.policy.team(team).weight, parts

    def has_below(self, team: str, model: str, value: int) -> bool:
        """Whether the team holds `model` GPUs at a priority below `value` (not stopping)."""
        account = _found(self._accounts, team, model)
        if account is None:
            return False
        lowest = account.lowest
        return lowest is not None and lowest < value

    def over_guarantee(self, team: str, model: str) -> bool:
        """Whether the team holds more `model` GPUs than its own guarantee (not stopping)."""
        account = _found(self._accounts, team, model)
        total = sum(account.filled.values()) if account is not None else 0.0
        return total > self._own(team, model).guaranteed + EPS

    def _at_or_above(self, team: str, model: str, value: int) -> float:
        total = 0.0  # sum() over a generator, without one: rooms read this per member
        models = self._accounts.get(team)  # `_found`, inlined: read per member of a room
        account = models.get(model) if models is not None else None
        if account is not None:
            for v, amount in account.filled.items():
                if v >= value:
                    total += amount
        return total

    def guaranteed(self, team: str, model: str) -> float:
        """The team's own guarantee of `model` GPUs (0 without quotas)."""
        return self._own(team, model).guaranteed if self.limited else 0.0

    def department_of(self, team: str) -> str | None:
        """The team's department, when quotas apply and it has one."""
        return self.policy.team(team).department if self.limited else None

    def pool(self, dept_name: str, model: str) -> float:
        """The part of a department's `model` guarantee its teams share."""
        return self._pool(dept_name, model)

    def _limits(
        self, team: str, model: str, account: _Account
    ) -> tuple[Quota, str | None, Quota | None]:
        """The team's own `model` quota, its department and the department's quota (worked
        out once, kept on the team's `model` account)."""
        found = account.limits
        if found is None:
            settings = self.policy.team(team)
            own = quota_for(settings.quotas, model) or _NO_QUOTA
            dept = self.policy.department(settings.department)
            quota = quota_for(dept.quotas, model) if dept is not None else None
            found = account.limits = (own, dept.name if dept is not None else None, quota)
        return found

    def _own(self, team: str, model: str) -> Quota:
        models = self._accounts.get(team)  # `_found`, inlined: read per member of a room
        account = models.get(model) if models is not None else None
        if account is None:
            account = _made(self._accounts, team, model, _Account)
        return self._limits(team, model, account)[0]

    def _pool(self, dept_name: str | None, model: str) -> float:
        """The department's guarantee its teams share: what their own ones leave over."""
        if dept_name is None:
            return 0.0
        cached = self._pools.get((dept_name, model))
        if cached is not None:
            return cached
        dept = self.policy.department(dept_name)
        quota = quota_for(dept.quotas, model) if dept is not None else None
        pool = 0.0
        if quota is not None:
            members = sum(
                self._own(t.name, model).guaranteed
                for t in self.policy.teams
                if t.department == dept_name
            )
            pool = max(0.0, quota.guaranteed - members)
        self._pools[(dept_name, model)] = pool
        return pool


_NO_QUOTA = Quota()

_T = TypeVar("_T")


def _found(table: dict[str, dict[str, _T]], outer: str, inner: str) -> _T | None:
    """`table[outer][inner]`, or None."""
    found = table.get(outer)
    return found.get(inner) if found is not None else None


def _made(table: dict[str, dict[str, _T]], outer: str, inner: str, make: Callable[[], _T]) -> _T:
    """`table[outer][inner]`, made (`make()`) and filed in first when missing."""
    found = table.get(outer)
    if found is None:
        found = table[outer] = {}
    item = found.get(inner)
    if item is None:
        item = found[inner] = make()
    return item


def _room_group(model: str, dept: str | None, team: str) -> tuple[str, str | None, str]:
    """The rooms one team's usage of `model` reads into: its department's, or its own."""
    return (model, dept, "") if dept is not None else (model, None, team)


def _limit_message(
    kind: str, name: str, model: str, used: float, limit: float, amount: float
) -> str:
    if used >= limit - EPS:
        return f"{kind} {name} is at its {model} limit {used:g}/{limit:g}"
    return (
        f"{kind} {name} would pass its {model} limit: {used:g}/{limit:g} in use, "
        f"needs {amount:g} more"
    )
