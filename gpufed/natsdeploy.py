"""`gpufed nats-authority init`: NATS operator-mode trust for the Kubernetes deployment.

The embedded federation (`gpufed up`) and deploy/ run NATS the same way: decentralized JWT
auth, one operator and the GPUFED account (`bus.authority`), and one credential per component
confined to its own subjects (`bus.identities`). This writes, under `--out`:

- `authority/`: the operator's and accounts' keys (0700; keep it offline, it mints every
  credential; run the command again with it to add a spoke or region, or to re-issue);
- `hub/nats-auth.yaml`: Secret `gpufed-nats-auth` with `auth.conf`, the operator JWT, system
  account and `full` resolver that deploy/nats/hub.conf includes;
- `hub/hub-nats.yaml`: Secret `gpufed-hub-nats`, the hub's URL and credential;
- `hub/spoke-<id>.yaml`: Secret `gpufed-spoke-nats` of a spoke that connects to the hub directly;
- `hub/burst-nats.yaml` (with `--burst`): Secret `gpufed-burst-nats`, the burst controller's
  URL, credential and `issuer` (the signing keys it mints and revokes each cloud instance's
  credential with);
- `regions/<region>/nats-auth.yaml`: the leaf node's `auth.conf` (operator, preloaded accounts,
  the hub's leaf address) and `leaf.creds`, its credential at the hub;
- `regions/<region>/spoke-<id>.yaml`: Secret `gpufed-spoke-nats` of each of its spokes;
- `regions/<region>/admin.creds`: a full GPUFED user for `gpufed region-streams` (0600).

Every file holding a secret is written 0600. Nothing here contacts a cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bus import identities
from bus.authority import NatsAuthority, write_secret
from bus.jwt import Permissions
from schemas.common import SPOKE_ID_PATTERN

NAMESPACE = "gpufed"
#: Where deploy/ mounts the Secret gpufed-nats-auth in a NATS server pod.
AUTH_MOUNT = "/etc/nats/auth"
#: Where the hub's NATS server keeps account updates (its data volume).
RESOLVER_DIR = "/data/jwt"
#: The client URL of a cluster's NATS service (hub cluster or regional leaf).
DEFAULT_CLIENT_URL = "tls://gpufed-nats:4222"
_REGION = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Region:
    """A regional cluster: its name (also its JetStream domain) and the spokes it serves."""

    name: str
    spokes: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Region:
        """`eu=eu-west-1,eu-central-1`; raises ValueError naming what is wrong."""
        name, sep, spokes = text.partition("=")
        ids = tuple(s for s in spokes.split(",") if s)
        if not sep or not ids or not _REGION.match(name):
            raise ValueError(f"--region {text!r}: expected REGION=SPOKE[,SPOKE...], e.g. eu=eu-1")
        for spoke in ids:
            _check_spoke(spoke)
        return cls(name, ids)


def write_deploy_auth(
    out: Path,
    *,
    now: int,
    regions: Sequence[Region] = (),
    hub_spokes: Sequence[str] = (),
    hub_leaf_url: str | None = None,
    hub_url: str = DEFAULT_CLIENT_URL,
    burst: bool = False,
) -> list[Path]:
    """Write the authority (created once, then reused) and every manifest; the paths written.

    `hub_leaf_url` is where regional leaf nodes reach the hub's port 7422 (required with
    regions). Raises ValueError for a bad spoke id or a missing hub address.
    """
    for spoke in hub_spokes:
        _check_spoke(spoke)
    if regions and not hub_leaf_url:
        raise ValueError("regions need --hub-leaf-url: where their leaf nodes reach the hub (7422)")
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    authority = NatsAuthority.open(out / "authority", now)
    written = [
        _secret(
            out / "hub" / "nats-auth.yaml",
            "gpufed-nats-auth",
            {"auth.conf": authority.auth_config(resolver_dir=RESOLVER_DIR)},
        ),
        _client(out / "hub" / "hub-nats.yaml", "gpufed-hub-nats", hub_url,
                authority.issue("hub", identities.hub_permissions(), now=now).creds),
    ]  # fmt: skip
    for spoke in hub_spokes:
        written.append(_spoke(out / "hub", authority, spoke, hub_url, now))
    if burst:
        controller = authority.issue(identities.BURST, identities.burst_permissions(), now=now)
        written.append(
            _secret(
                out / "hub" / "burst-nats.yaml",
                "gpufed-burst-nats",
                {"url": hub_url, "creds": controller.creds, "issuer": authority.issuer(now)},
            )
        )
    for region in regions:
        folder = out / "regions" / region.name
        leaf = authority.issue(
            f"leaf-{region.name}", identities.leaf_permissions(region.spokes, region.name), now=now
        )
        auth = authority.auth_config() + (
            f"GPUFED_ACCOUNT: {authority.account.public}\n"
            f"GPUFED_HUB_LEAF_URL: {json.dumps(hub_leaf_url)}\n"
        )
        written.append(
            _secret(
                folder / "nats-auth.yaml",
                "gpufed-nats-auth",
                {"auth.conf": auth, "leaf.creds": leaf.creds},
            )
        )
        for spoke in region.spokes:
            written.append(_spoke(folder, authority, spoke, DEFAULT_CLIENT_URL, now))
        admin = authority.issue(f"admin-{region.name}", Permissions(), now=now)
        written.append(write_secret(folder / "admin.creds", admin.creds))
    return written


def _check_spoke(spoke: str) -> None:
    if not re.fullmatch(SPOKE_ID_PATTERN, spoke):
        raise ValueError(f"{spoke!r} is not a spoke id (letters, digits, '_' and '-')")


def _spoke(folder: Path, authority: NatsAuthority, spoke: str, url: str, now: int) -> Path:
    issued = authority.issue(f"spoke-{spoke}", identities.spoke_permissions(spoke), now=now)
    return _client(folder / f"spoke-{spoke}.yaml", "gpufed-spoke-nats", url, issued.creds)


def _client(path: Path, name: str, url: str, creds: str) -> Path:
    """A component's Secret: the URL and the credential it reads as files."""
    return _secret(path, name, {"url": url, "creds": creds})


def _secret(path: Path, name: str, data: dict[str, str]) -> Path:
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "gpufed"},
        },
        "type": "Opaque",
        "stringData": data,
    }
    text = yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=1_000_000)
    return write_secret(path, text)


class _Dumper(yaml.SafeDumper):
    """Multi-line values (configs, creds) as literal blocks, readable in the manifest."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
