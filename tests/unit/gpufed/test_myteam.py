"""Which team a command takes when its user names none (`gpufed.myteam.team_of`)."""

from __future__ import annotations

import pytest

from gpufed.myteam import TeamNotGiven, team_of


def test_the_one_team_a_member_or_team_admin_may_submit_for() -> None:
    assert team_of({"user": "alice", "admin": False, "teams": {"vision": "member"}}) == "vision"
    # A viewer's teams are no choice: she may not submit there.
    me = {"user": "bo", "admin": False, "teams": {"nlp": "viewer", "vision": "team-admin"}}
    assert team_of(me) == "vision"


def test_several_teams_are_named_for_the_user_to_choose() -> None:
    me = {"user": "carl", "admin": False, "teams": {"vision": "member", "nlp": "member"}}
    with pytest.raises(TeamNotGiven) as raised:
        team_of(me)
    assert str(raised.value) == "say which team with --team: carl may submit for nlp, vision"


def test_no_team_to_submit_for_says_what_the_token_holds() -> None:
    with pytest.raises(TeamNotGiven, match=r"dana may submit for no team \(no role in any team\)"):
        team_of({"user": "dana", "admin": False, "teams": {}})
    with pytest.raises(TeamNotGiven, match="is an admin, of every team"):
        team_of({"user": "ops", "admin": True, "teams": {}})
