"""Who may do what: roles, principals and the team-scoped decisions of the API.

Pure: a principal and an action in, allowed or not out. The API asks these functions and
turns a refusal into 403 naming the team; it never decides access itself.

Roles (a principal holds one role per team, or is an admin of everything):

- ``viewer``: reads its teams' workloads and burst instances.
- ``member``: viewer, plus submits for and cancels the work of its teams.
- ``team-admin``: member, plus its teams' usage and audit log.
- ``admin``: everything, on every team: policy, tokens, the whole audit log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    ADMIN = "admin"


class Action(StrEnum):
    """What a request does to a team's things."""

    READ = "read"  # workloads, burst instances
    SUBMIT = "submit"
    CANCEL = "cancel"
    USAGE = "usage"
    AUDIT = "audit"


#: The least role each action needs on the team concerned.
_NEEDS: Mapping[Action, Role] = {
    Action.READ: Role.VIEWER,
    Action.SUBMIT: Role.MEMBER,
    Action.CANCEL: Role.MEMBER,
    Action.USAGE: Role.TEAM_ADMIN,
    Action.AUDIT: Role.TEAM_ADMIN,
}
_RANK: Mapping[Role, int] = {Role.VIEWER: 0, Role.MEMBER: 1, Role.TEAM_ADMIN: 2, Role.ADMIN: 3}


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a user name, a role per team, or admin of everything.

    `via` says how it was authenticated (`token:<id>`, `oidc:<issuer>`, `admin-token`) for the
    audit log.
    """

    user: str
    teams: Mapping[str, Role] = field(default_factory=dict)
    admin: bool = False
    via: str = ""

    @property
    def role_label(self) -> str:
        """One word for logs: `admin`, or the highest team role held."""
        if self.admin:
            return Role.ADMIN.value
        if not self.teams:
            return "none"
        return max(self.teams.values(), key=lambda r: _RANK[r]).value

    def role_on(self, team: str | None) -> str:
        """One word for the audit log: `admin`, the role held on `team` (`none`: no role
        there, as a member refused another team's work), or with no team the highest held."""
        if self.admin or team is None:
            return self.role_label
        role = self.teams.get(team)
        return role.value if role is not None else "none"


def allowed(principal: Principal, action: Action, team: str) -> bool:
    """Whether `principal` may do `action` on `team`'s things."""
    if principal.admin:
        return True
    role = principal.teams.get(team)
    return role is not None and _RANK[role] >= _RANK[_NEEDS[action]]


def permitted_teams(principal: Principal, action: Action) -> frozenset[str] | None:
    """The teams `principal` may do `action` on; None means every team (an admin)."""
    if principal.admin:
        return None
    return frozenset(t for t in principal.teams if allowed(principal, action, t))


def merge_roles(grants: Iterable[tuple[str, Role]]) -> dict[str, Role]:
    """One role per team from several grants (e.g. OIDC groups): the highest wins."""
    teams: dict[str, Role] = {}
    for team, role in grants:
        held = teams.get(team)
        if held is None or _RANK[role] > _RANK[held]:
            teams[team] = role
    return teams
