"""`gpufed nats-authority init|revoke`: NATS operator-mode trust for deploy/ (Kubernetes).

What they write and why: gpufed/natsdeploy.py; how to use them: deploy/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any


def add_authority_commands(sub: Any) -> None:
    """Register `nats-authority` and its actions."""
    authority = sub.add_parser(
        "nats-authority", help="NATS operator, accounts and credentials for deploy/ (Kubernetes)"
    )
    authority_sub = authority.add_subparsers(metavar="ACTION")
    init = authority_sub.add_parser(
        "init", help="write the operator and accounts, and per-component Secret manifests"
    )
    init.add_argument("--out", type=Path, required=True, help="folder (kept private: 0700)")
    init.add_argument(
        "--region", action="append", default=[], metavar="REGION=SPOKE[,SPOKE]",
        help="a regional cluster's leaf node and its spokes (repeat per region)",
    )  # fmt: skip
    init.add_argument(
        "--hub-spoke", action="append", default=[], metavar="ID",
        help="a spoke connecting to the hub's NATS directly (e.g. a cloud spoke)",
    )  # fmt: skip
    init.add_argument("--hub-leaf-url", help="where leaf nodes reach the hub, tls://HOST:7422")
    init.add_argument(
        "--burst", action="store_true",
        help="also the burst controller's credential and instance issuer (hub/burst-nats.yaml)",
    )  # fmt: skip
    init.add_argument(
        "--hub-url", default="tls://gpufed-nats:4222", help="the hub cluster's NATS client URL"
    )
    init.set_defaults(func=_nats_authority_init)
    revoke = authority_sub.add_parser(
        "revoke", help="refuse every credential issued to these components from now on"
    )
    revoke.add_argument("--out", type=Path, required=True, help="the folder of `init`")
    revoke.add_argument(
        "--nats-url",
        help="the hub cluster's NATS, by a name its certificate carries: cut them there at once",
    )
    revoke.add_argument("--nats-ca", type=Path, help="CA of that server's certificate (tls://)")
    revoke.add_argument(
        "names", nargs="+", metavar="NAME", help="spoke-<id> (or the id), hub, leaf-<region>..."
    )
    revoke.set_defaults(func=_nats_authority_revoke)


def _nats_authority_init(args: argparse.Namespace) -> int:
    from gpufed.natsdeploy import Region, write_deploy_auth

    try:
        written = write_deploy_auth(
            args.out,
            now=int(time.time()),
            regions=[Region.parse(r) for r in args.region],
            hub_spokes=args.hub_spoke,
            hub_leaf_url=args.hub_leaf_url,
            hub_url=args.hub_url,
            burst=args.burst,
        )
    except (OSError, ValueError) as exc:
        print(f"gpufed nats-authority init: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def _nats_authority_revoke(args: argparse.Namespace) -> int:
    from bus.issuer import IssuerError
    from gpufed.natsdeploy import push_deploy_revocations, revoke_deploy_auth

    now = int(time.time())
    try:
        revoked = revoke_deploy_auth(args.out, args.names, now)
    except (OSError, ValueError) as exc:
        print(f"gpufed nats-authority revoke: {exc}", file=sys.stderr)
        return 2
    for name in sorted(set(revoked.users.values())):
        keys = sorted(k for k, n in revoked.users.items() if n == name)
        print(f"revoked {name}: {len(keys)} credential(s) ({', '.join(k[:12] for k in keys)})")
    for path in revoked.written:
        print(
            f"wrote {path}: apply it in its region, then reload that leaf "
            "(kubectl -n gpufed exec gpufed-nats-0 -- nats-server --signal reload=1)"
        )
    if not args.nats_url:
        print(
            "not pushed to the hub's NATS: run again with --nats-url to cut them off there",
            file=sys.stderr,
        )
        return 0
    ca = str(args.nats_ca) if args.nats_ca else None
    try:
        asyncio.run(push_deploy_revocations(revoked, args.nats_url, now, ca))
    except IssuerError as exc:
        print(f"gpufed nats-authority revoke: {exc} (the files are written)", file=sys.stderr)
        return 1
    print(f"pushed to the hub's NATS at {args.nats_url}: their connections there are closed")
    return 0
