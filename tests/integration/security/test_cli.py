"""The commands as a user types them, against a real hub process: `gpufed token create` prints
the token alone on its last line, the CLI finds `gpufed up`'s admin token by itself, and a
member's token gets exactly a member's rights."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from gpufed.cli import main
from gpufed.up import Federation


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Federation]:
    fed = Federation(tmp_path / ".gpufed", 0, fleet=())
    fed.start(timeout_s=60)
    # As after `gpufed up` in this folder: no token in the environment, the file beside it.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUFED_API", fed.api_url)
    for name in ("GPUFED_TOKEN", "GPUFED_ADMIN_TOKEN", "GPUFED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield fed
    finally:
        fed.stop()


def gpufed(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_token_create_as_spelled_then_cross_team_work_is_refused_and_audited(
    hub: Federation, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stat.S_IMODE(os.stat(hub.token_file).st_mode) == 0o600
    tokens = {}
    for user, team in (("alice", "vision"), ("bob", "nlp")):
        code, out, _ = gpufed(
            capsys, "token", "create", "--user", user, "--team", team, "--role", "member"
        )
        assert code == 0
        tokens[user] = out.splitlines()[-1]
        assert tokens[user].startswith("gpufed_") and " " not in tokens[user]
    code, out, _ = gpufed(capsys, "token", "create", "--user", "ops", "--role", "admin")
    assert code == 0 and out.splitlines()[-1].startswith("gpufed_")
    # A lifetime as people say it; a negative one refused in the flag's words.
    ci = ("token", "create", "--user", "ci", "--team", "vision", "--role", "viewer", "--ttl")
    code, out, _ = gpufed(capsys, *ci, "12h", "--json")
    created = json.loads(out[: out.rindex("}") + 1])
    assert code == 0 and created["expires_at"] - created["created_at"] == pytest.approx(43200)
    code, out, err = gpufed(capsys, *ci, "-5")
    assert (code, out) == (2, "") and err.startswith("gpufed token create --ttl: cannot read")

    monkeypatch.setenv("GPUFED_TOKEN", tokens["bob"])
    code, out, _ = gpufed(capsys, "submit", "--name", "bobs", "--team", "nlp", "--", "true")
    assert code == 0
    bobs = out.strip()
    after_bobs = time.time()  # the hub wrote its entry before it answered

    monkeypatch.setenv("GPUFED_TOKEN", tokens["alice"])
    code, _, err = gpufed(capsys, "submit", "--name", "x", "--team", "nlp", "--", "true")
    assert code == 1 and "nlp" in err and "forbidden" in err
    code, out, _ = gpufed(capsys, "jobs", "--json")
    assert code == 0 and bobs not in out
    code, _, err = gpufed(capsys, "cancel", bobs)
    assert code == 1 and "nlp" in err
    code, _, err = gpufed(capsys, "audit")
    assert code == 1 and "team-admin" in err

    # A refused spec names the flag a user typed, not only the API's field.
    submit_z = ("submit", "--name", "z", "--team", "vision")
    code, _, err = gpufed(capsys, *submit_z, "--gpus", "0", "--", "true")
    assert code == 1 and "gpus_per_node: " in err and "(--gpus) [invalid_workload]" in err
    code, _, err = gpufed(capsys, *submit_z)
    assert code == 1 and "command: Field required (the program and its arguments after --)" in err

    monkeypatch.delenv("GPUFED_TOKEN")  # back to the admin token file
    code, out, _ = gpufed(capsys, "audit")
    lines = [line.split() for line in out.splitlines()]
    # Alice's role on nlp, whose work she tried: none (she is a member of vision only).
    assert any(
        line[2:6] == ["alice", "none", "submit", "nlp"] and "denied" in line for line in lines
    )
    assert any(
        line[2:6] == ["alice", "none", "cancel", "nlp"] and "denied" in line for line in lines
    )
    assert any(line[2:6] == ["bob", "member", "submit", "nlp"] and bobs in line for line in lines)
    # What one token did (a leaked one, say): bob's, by its id.
    bobs_token = tokens["bob"].split("_")[1]
    code, out, _ = gpufed(capsys, "audit", "--token", bobs_token)
    assert code == 0
    assert [line.split()[2:9] for line in out.splitlines()[1:]] == [
        ["bob", "member", "submit", "nlp", bobs, "ok", f"token:{bobs_token}"]
    ]
    # --since: what came after (alice's refusals, not bob's submit); a page that is full says
    # older entries match too.
    code, out, err = gpufed(capsys, "audit", "--since", str(after_bobs))
    assert code == 0 and err == ""
    assert [line.split()[2:5] for line in out.splitlines()[1:]] == [
        ["alice", "none", "submit"],
        ["alice", "none", "cancel"],
    ]
    code, out, err = gpufed(capsys, "audit", "--limit", "1")
    assert code == 0 and len(out.splitlines()) == 2
    assert err == "gpufed audit: the newest 1 entries; older ones match too (--limit, --since)\n"
    code, out, err = gpufed(capsys, "audit", "--since", "last tuesday")
    assert code == 2 and err.startswith("gpufed audit --since: cannot read the time 'last tuesday'")


def test_a_member_of_one_team_need_not_name_it(
    hub: Federation, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = {}
    for user, role in (("alice", "member"), ("ci", "viewer")):
        code, out, _ = gpufed(
            capsys, "token", "create", "--user", user, "--team", "vision", "--role", role
        )
        assert code == 0
        tokens[user] = out.splitlines()[-1]
    # The admin may submit for any team: asked which, not told `team: Field required`.
    code, out, err = gpufed(capsys, "submit", "--name", "a", "--", "true")
    assert (code, out) == (2, "")
    assert err == "gpufed: say which team with --team: admin is an admin, of every team\n"
    code, _, err = gpufed(capsys, "service", "create", "--name", "chat", "--", "sleep", "60")
    assert code == 2 and "say which team with --team" in err

    monkeypatch.setenv("GPUFED_TOKEN", tokens["alice"])
    code, out, _ = gpufed(capsys, "submit", "--name", "mine", "--", "true")
    assert code == 0
    mine = out.strip()
    code, out, _ = gpufed(capsys, "jobs", "--json")
    assert [(r["id"], r["spec"]["team"]) for r in json.loads(out)] == [(mine, "vision")]
    code, out, _ = gpufed(capsys, "service", "create", "--name", "chat", "--", "sleep", "60")
    assert code == 0 and out.startswith("vision/chat: generation 1")
    # A team she names is still the one asked for (and refused where she is no member).
    code, _, err = gpufed(capsys, "submit", "--name", "x", "--team", "nlp", "--", "true")
    assert code == 1 and "alice may not submit work for team nlp" in err

    # A flag spelled as its field is named too, and so is one the hub's answer names by field.
    code, _, err = gpufed(capsys, "submit", "--team", "vision", "--", "true")
    assert code == 1 and err == "gpufed: name: Field required (--name) [invalid_workload]\n"
    code, _, err = gpufed(capsys, "submit", "--name", "z", "--priority", "urgent", "--", "true")
    assert code == 1 and err.startswith("gpufed: priority class 'urgent' is not defined (known: ")
    assert err.endswith(") (--priority) [invalid_workload]\n")

    # A time limit as people say it; what is no length of time is refused before any request.
    code, out, _ = gpufed(capsys, "submit", "--name", "r", "--max-runtime", "90m", "--", "true")
    assert code == 0
    code, shown, _ = gpufed(capsys, "explain", out.strip(), "--json")
    assert json.loads(shown)["spec"]["max_runtime_s"] == 5400
    with pytest.raises(SystemExit) as exited:
        gpufed(capsys, "submit", "--name", "r", "--max-runtime", "10x", "--", "true")
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "argument --max-runtime: cannot read the length of time '10x'" in err

    monkeypatch.setenv("GPUFED_TOKEN", tokens["ci"])
    code, _, err = gpufed(capsys, "submit", "--name", "b", "--", "true")
    assert code == 2 and err == (
        "gpufed: ci may submit for no team (viewer of vision): a submission needs a member's "
        "token of its team\n"
    )

    # An empty listing says so, and a team the hub has never heard of (a typo) is named.
    monkeypatch.delenv("GPUFED_TOKEN")  # the admin, who may list any team's work
    code, out, err = gpufed(capsys, "jobs", "--team", "vision", "--phase", "failed")
    assert (code, out, err) == (0, "", "no workloads of team vision in phase failed\n")
    code, out, err = gpufed(capsys, "jobs", "--team", "visoin")
    assert (code, out) == (0, "")
    assert err.startswith("no workloads: no team 'visoin' (teams: ") and "vision" in err
    code, out, _ = gpufed(capsys, "jobs", "--team", "visoin", "--json")
    assert (code, json.loads(out)) == (0, [])


def test_without_a_token_the_cli_says_how_to_get_one(
    hub: Federation, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFED_TOKEN_FILE", str(hub.data_dir / "missing.token"))
    code, _, err = gpufed(capsys, "jobs")
    assert code == 1 and "GPUFED_TOKEN" in err and "unauthenticated" in err


def test_bootstrap_through_the_store_and_revoke(
    hub: Federation, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{hub.data_dir / 'hub' / 'hub.db'}"
    # The URL from a file, as from a mounted Secret (a missing one: said, not a traceback).
    url_file = hub.data_dir / "store-url"
    args = ("token", "create", "--store-url-file", str(url_file), "--user", "ops2")
    code, out, err = gpufed(capsys, *args, "--role", "admin")
    assert code == 2 and not out
    assert f"--store-url-file: No such file or directory: {url_file}" in err
    url_file.write_text(url + "\n")
    code, out, _ = gpufed(capsys, *args, "--role", "admin")
    assert code == 0
    token = out.splitlines()[-1]
    monkeypatch.setenv("GPUFED_TOKEN", token)
    code, out, _ = gpufed(capsys, "whoami")
    assert code == 0 and "ops2" in out and "admin of every team" in out
    code, out, _ = gpufed(capsys, "token", "list", "--json")
    token_id = token.split("_")[1]
    assert code == 0 and token_id in out and token.split("_", 2)[2] not in out
    assert gpufed(capsys, "token", "revoke", token_id)[0] == 0
    code, _, err = gpufed(capsys, "whoami")
    assert code == 1 and "revoked" in err

    # A leaked token revoked in the store, with no admin token at hand: list, revoke, audited.
    monkeypatch.delenv("GPUFED_TOKEN")
    (hub.data_dir / "admin.token").unlink()
    store = ("--store-url-file", str(url_file))
    code, out, _ = gpufed(capsys, "token", "create", "--user", "leaky", "--team", "nlp", *store)
    leaked = out.splitlines()[-1]
    leaked_id = leaked.split("_")[1]
    code, out, _ = gpufed(capsys, "token", "list", *store)
    listed = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert code == 0 and listed[token_id][-1] == "revoked" and listed[leaked_id][-1] == "active"
    code, out, _ = gpufed(capsys, "token", "revoke", leaked_id, *store)
    assert (code, out) == (0, f"token {leaked_id} (leaky) revoked\n")
    monkeypatch.setenv("GPUFED_TOKEN", leaked)
    code, _, err = gpufed(capsys, "whoami")
    assert code == 1 and "revoked" in err
    code, _, err = gpufed(capsys, "token", "revoke", "nosuch", *store)
    assert code == 1 and err.startswith("gpufed token revoke: no token nosuch in that store")
    monkeypatch.setenv("GPUFED_TOKEN", hub.admin_token)
    code, out, _ = gpufed(capsys, "audit", "--action", "token.revoke")
    assert any(
        line.split()[2:9] == ["store", "admin", "token.revoke", "nlp", leaked_id, "ok", "store"]
        for line in out.splitlines()
    )


def test_bootstrap_into_a_store_it_cannot_open_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A path with a typo in it: no new, empty store made, which no hub would ever read.
    hint = "(a hub makes its store at its first start: give the URL it runs with)"
    for path in (tmp_path / "no-such-folder" / "hub.db", tmp_path / "hub.dbb"):
        url = f"sqlite:///{path}"
        args = ("token", "create", "--store-url", url, "--user", "ops", "--role", "admin")
        code, out, err = gpufed(capsys, *args)
        assert (code, out) == (1, "")
        assert (
            err == f"gpufed token create: cannot open the hub's store {url}: no such file {hint}\n"
        )
        assert not path.exists()
    # A database that is there but no hub's: not given tables and a token.
    (tmp_path / "other.db").write_bytes(b"")
    url = f"sqlite:///{tmp_path / 'other.db'}"
    code, out, err = gpufed(capsys, *args[:3], url, *args[4:])
    assert (code, out) == (1, "")
    assert err.endswith(f"{url}: it holds no gpufed tables {hint}\n"), err
    assert (tmp_path / "other.db").stat().st_size == 0
    # A grant that cannot be a token is said the same way, before any database is opened.
    args = ("token", "create", "--store-url", url, "--user", "ops", "--team", "Bad_X")
    code, out, err = gpufed(capsys, *args)
    assert (code, out) == (1, "") and err.startswith("gpufed token create: team: ")


def test_bootstrap_into_a_postgresql_database_that_holds_no_hub_store_is_refused(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PostgreSQL up, the database there, but no hub ever made its store in it (a typo in the
    database name of a server with several): refused, and no tables made in it."""
    url_file = tmp_path / "store-url"
    url_file.write_text(pg_url + "\n")
    url_file.chmod(0o600)
    args = ("token", "create", "--store-url-file", str(url_file), "--user", "ops")
    code, out, err = gpufed(capsys, *args, "--role", "admin")
    assert (code, out) == (1, "")
    assert "it holds no gpufed tables" in err and make_url(pg_url).password not in err
    engine = create_engine(pg_url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
