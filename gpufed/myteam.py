"""The team a command works for when its user names none: theirs, where they have one.

A member of one team (most data scientists) need not type `--team` on every `gpufed submit`,
`session open` or `service create`: the hub says which teams the token may submit for
(`GET /v1/whoami`), and with exactly one that is the team, as kubectl takes its context's
namespace. With none, or several, or as an admin (who may submit for any team), the command
says so and which teams there are, instead of the API's bare `team: Field required`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

#: The roles that may submit (`hub.core.access`: SUBMIT needs `member`, and a team-admin is more).
SUBMITTING = frozenset({"member", "team-admin"})


class TeamNotGiven(ValueError):
    """No `--team` was given and none follows from the caller's roles: the message says why."""


class WhoAsks(Protocol):
    def whoami(self) -> dict[str, Any]: ...


def team_of(me: Mapping[str, Any]) -> str:
    """The one team `me` (the hub's answer to `GET /v1/whoami`) may submit for; TeamNotGiven,
    naming `--team` and the teams there are, when that is not one team."""
    user = me.get("user") or "this token"
    roles: Mapping[str, str] = me.get("teams") or {}
    if me.get("admin"):
        raise TeamNotGiven(f"say which team with --team: {user} is an admin, of every team")
    teams = sorted(team for team, role in roles.items() if role in SUBMITTING)
    if len(teams) == 1:
        return teams[0]
    if teams:
        raise TeamNotGiven(f"say which team with --team: {user} may submit for {', '.join(teams)}")
    held = ", ".join(f"{role} of {team}" for team, role in sorted(roles.items()))
    raise TeamNotGiven(
        f"{user} may submit for no team ({held or 'no role in any team'}): a submission needs"
        " a member's token of its team"
    )


def fill_team(spec: dict[str, Any], client: WhoAsks) -> None:
    """Set `spec`'s team to the caller's one team when neither the flags nor the spec's file
    named one (`team_of`); one request to the hub, only then."""
    if not spec.get("team"):
        spec["team"] = team_of(client.whoami())
