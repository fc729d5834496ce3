"""`gpufed token create|list|revoke`, `gpufed audit` and `gpufed whoami`.

`gpufed token` talks to the hub's REST API with the caller's own token (it must be an admin's:
`GPUFED_TOKEN`, or the `admin.token` file `gpufed up` writes). To bootstrap a hub nobody holds a
token for yet, or to revoke a leaked one with no other admin token at hand, `--store-url` reads
and writes the hub's database directly instead (`gpufed.token_store`): whoever can write that
database is an admin already, and each write is audited there as actor `store`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufed.secretfile import read_secret_file
from gpufed.token_store import create_in_store, revoke_in_store, tokens_in_store
from gpufed.when import parse_duration, parse_when
from schemas.common import nearest_name

ROLES = ("viewer", "member", "team-admin", "admin")


def add_token_commands(sub: Any, command: Any) -> None:
    """Register `token`, `audit` and `whoami`; `command` adds a client command (see commands)."""
    token = command("token", "create, list or revoke API tokens (admin)", _token)
    token.add_argument("action", choices=["create", "list", "revoke"])
    token.add_argument("id", nargs="?", help="token id (for revoke)")
    token.add_argument("--user", help="who the token is for (create)")
    token.add_argument("--team", help="the team it acts for (create; not with --role admin)")
    token.add_argument("--role", choices=ROLES, default="member")
    token.add_argument("--ttl", default=None, help="how long until it expires: seconds, 12h, 90d")
    token.add_argument(
        "--store-url",
        default=None,
        help="the hub's database directly instead of the API (bootstrap, or a leaked token "
        "to revoke with no other admin token at hand)",
    )
    token.add_argument(
        "--store-url-file",
        type=Path,
        default=None,
        help="the same, the URL read from a file (a mounted Secret: no password in argv)",
    )

    audit = command("audit", "the audit log: who did what, when, with what result", _audit)
    audit.add_argument("--team")
    audit.add_argument("--action", help="submit, cancel, policy.set, token.create, ...")
    audit.add_argument(
        "--since", default=None, help="unix time, ISO date/time, or an age like 2h or 7d (all)"
    )
    audit.add_argument("--limit", type=int, default=50, help="the newest this many (50)")
    audit.add_argument(
        "--token", help="only what this token did (its id, as `gpufed token list` shows it)"
    )

    command("whoami", "the identity and team roles of the token in use", _whoami)


def _token(args: argparse.Namespace) -> int:
    store_url = args.store_url
    if args.store_url_file is not None:
        try:
            store_url = read_secret_file(args.store_url_file, "--store-url-file")
        except ValueError as exc:
            print(f"gpufed token {args.action}: {exc}", file=sys.stderr)
            return 2
    try:
        return _token_action(args, store_url or None)
    except ValueError as exc:  # the store's (gpufed.token_store), in words
        print(f"gpufed token {args.action}: {exc}", file=sys.stderr)
        return 1


def _token_action(args: argparse.Namespace, store_url: str | None) -> int:
    if args.action == "create":
        if not args.user:
            print("gpufed token create: give --user", file=sys.stderr)
            return 2
        team = None if args.role == "admin" else args.team
        if args.role == "admin" and args.team:
            print("gpufed token create: an admin token takes no --team", file=sys.stderr)
            return 2
        if args.role != "admin" and not args.team:
            print(f"gpufed token create: a {args.role} token needs --team", file=sys.stderr)
            return 2
        try:
            ttl = parse_duration(args.ttl) if args.ttl is not None else None
        except ValueError as exc:
            print(f"gpufed token create --ttl: {exc}", file=sys.stderr)
            return 2
        if store_url:
            created = create_in_store(store_url, args.user, args.role, team, ttl)
        else:
            created = args.client.create_token(args.user, args.role, team, ttl)
        if team is not None and not store_url:
            _warn_if_unlisted(args.client.policy(), team)
        scope = "every team" if team is None else f"team {team}"
        if args.json:
            print(json.dumps({k: v for k, v in created.items() if k != "token"}, indent=2))
        else:
            print(
                f"token {created['id']}: {created['user']}, {created['role']} of {scope}"
                " (shown once; keep it in a secret store)"
            )
        print(created["token"])  # alone on the last line, for `$(... | tail -1)`
        return 0
    if args.action == "list":
        tokens = tokens_in_store(store_url) if store_url else args.client.tokens()
        if args.json:
            print(json.dumps(tokens, indent=2))
            return 0
        rows = [("ID", "USER", "ROLE", "TEAM", "CREATED", "BY", "STATE")]
        now = time.time()
        for t in tokens:
            state = "active"
            if t["revoked_at"] is not None:
                state = "revoked"
            elif t["expires_at"] is not None and t["expires_at"] <= now:
                state = "expired"
            rows.append(
                (
                    t["id"],
                    t["user"],
                    t["role"],
                    t["team"] or "*",
                    _when(t["created_at"]),
                    t["created_by"],
                    state,
                )
            )
        _table(rows)
        return 0
    if not args.id:
        print("gpufed token revoke: give the token id (gpufed token list)", file=sys.stderr)
        return 2
    if store_url:
        revoked = revoke_in_store(store_url, args.id)
    else:
        revoked = args.client.revoke_token(args.id)
    print(f"token {revoked['id']} ({revoked['user']}) revoked")
    return 0


def _audit(args: argparse.Namespace) -> int:
    try:
        since = parse_when(args.since, time.time()) if args.since else 0.0
    except ValueError as exc:
        print(f"gpufed audit --since: {exc}", file=sys.stderr)
        return 2
    via = f"token:{args.token}" if args.token else None
    entries = args.client.audit(
        team=args.team, action=args.action, since=since, limit=args.limit, via=via
    )
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    if len(entries) == args.limit:
        print(
            f"gpufed audit: the newest {args.limit} entries; older ones match too "
            "(--limit, --since)",
            file=sys.stderr,
        )
    rows = [("WHEN", "WHO", "ROLE", "ACTION", "TEAM", "TARGET", "RESULT", "VIA", "DETAIL")]
    for e in reversed(entries):
        rows.append(
            (
                _when(e["at"]),
                e["actor"],
                e["role"],
                e["action"],
                e["team"] or "-",
                e["target"] or "-",
                e["result"],
                e.get("via") or "-",
                e["detail"],
            )
        )
    _table(rows)
    return 0


def _whoami(args: argparse.Namespace) -> int:
    me = args.client.whoami()
    if args.json:
        print(json.dumps(me, indent=2))
        return 0
    roles = (
        "admin of every team"
        if me["admin"]
        else ", ".join(f"{role} of {team}" for team, role in sorted(me["teams"].items()))
    )
    print(f"{me['user']}: {roles or 'no team'} (via {me['via']})")
    return 0


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _warn_if_unlisted(policy: dict[str, Any], team: str) -> None:
    """A token for a team the policy does not list (a typo, most likely) works, but only with
    the default team's quotas: say so, with the listed team it likely meant."""
    listed = [str(t.get("name")) for t in policy.get("teams", [])]
    if listed and team not in listed:
        near = nearest_name(team, listed)
        hint = f"; did you mean {near}?" if near else ""
        print(
            f"gpufed token create: warning: team {team} is not in the policy (its work gets the "
            f"default team's quotas){hint}",
            file=sys.stderr,
        )
