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
- `regions/<region>/spoke-<id>.yaml`: Secret `gpufed-spoke-nats` of each of its spokes, and
  the same credential as a plain `spoke-<id>.creds` (0600) for a spoke outside Kubernetes (a
  Slurm login node: deploy/slurm/README.md); `hub/spoke-<id>.creds` likewise;
- `regions/<region>/admin.creds`: a full GPUFED user for `gpufed region-streams` (0600).

`gpufed nats-authority revoke --out DIR NAME...` refuses a leaked credential from then on:
every key issued to NAME (`authority/issued.json`) is noted in `authority/revoked.json`, each
region's `nats-auth.yaml` is written again with those keys revoked (apply it, reload the leaf),
and with `--nats-url` the revocation is pushed to the hub's servers, which cut them at once.

Every file holding a secret is written 0600. Nothing here contacts a cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bus import identities, jwt
from bus.authority import NatsAuthority, write_secret
from bus.issuer import push_revocations
from bus.jwt import Permissions
from schemas.common import SPOKE_ID_PATTERN

NAMESPACE = "gpufed"
#: Where deploy/ mounts the Secret gpufed-nats-auth in a NATS server pod.
AUTH_MOUNT = "/etc/nats/auth"
#: Where the hub's NATS server keeps account updates (its data volume).
RESOLVER_DIR = "/data/jwt"
#: The client URL of a cluster's NATS service (hub cluster or regional leaf).
DEFAULT_CLIENT_URL = "tls://gpufed-nats:4222"
_HUB_LEAF_URL = "GPUFED_HUB_LEAF_URL"
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
                authority.issue("hub", identities.hub_permissions(), now=now, keep=True).creds),
    ]  # fmt: skip
    for spoke in hub_spokes:
        written += _spoke(out / "hub", authority, spoke, hub_url, now)
    if burst:
        controller = authority.issue(
            identities.BURST, identities.burst_permissions(), now=now, keep=True
        )
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
            f"leaf-{region.name}",
            identities.leaf_permissions(region.spokes, region.name),
            now=now,
            keep=True,
        )
        assert hub_leaf_url is not None
        written.append(_leaf_auth(folder, authority, hub_leaf_url, leaf.creds))
        for spoke in region.spokes:
            written += _spoke(folder, authority, spoke, DEFAULT_CLIENT_URL, now)
        admin = authority.issue(f"admin-{region.name}", Permissions(), now=now, keep=True)
        written.append(write_secret(folder / "admin.creds", admin.creds))
    return written


@dataclass(frozen=True, slots=True)
class Revoked:
    """What `revoke_deploy_auth` did: the user keys revoked (key -> name), the Secrets
    rewritten (each region's leaf accounts), and the authority, for the push to the hub."""

    users: dict[str, str]
    written: list[Path]
    authority: NatsAuthority


def revoke_deploy_auth(out: Path, names: Sequence[str], now: int) -> Revoked:
    """`gpufed nats-authority revoke`: every credential `init` issued to these names (a
    component's, e.g. `spoke-eu-1`, `hub`, `leaf-eu`, `admin-eu`; a bare spoke id means its
    spoke) is refused from now on by the regions' leaf nodes, whose `nats-auth.yaml` is
    written again with them revoked. The hub's servers learn it from `push_deploy_revocations`.
    Raises ValueError for a folder without an authority or a name nothing was issued to."""
    if not (out / "authority").is_dir():
        raise ValueError(f"{out}: no authority here; it is the --out of `nats-authority init`")
    authority = NatsAuthority.open(out / "authority", now)
    issued = {**_issued_in(out, authority), **authority.issued()}
    known = set(issued.values())
    wanted: set[str] = set()
    for name in names:
        full = name if name in known else f"spoke-{name}"
        if full not in known:
            raise ValueError(
                f"nothing was issued to {name!r} here; issued: {', '.join(sorted(known))}"
            )
        wanted.add(full)
    users = {user: name for user, name in issued.items() if name in wanted}
    authority.revoke(users, now)
    written = []
    for path in sorted((out / "regions").glob("*/nats-auth.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))["stringData"]
        url = re.search(rf"^{_HUB_LEAF_URL}: (.*)$", data["auth.conf"], re.MULTILINE)
        if url is None:
            raise ValueError(f"{path}: no {_HUB_LEAF_URL} in its auth.conf")
        written.append(_leaf_auth(path.parent, authority, json.loads(url[1]), data["leaf.creds"]))
    return Revoked(users, written, authority)


def _issued_in(out: Path, authority: NatsAuthority) -> dict[str, str]:
    """The users of the credentials written under `out` (key -> name): what an `init` from
    before `authority/issued.json` was kept issued last."""
    found: dict[str, str] = {}
    texts = [p.read_text(encoding="utf-8") for p in sorted(out.rglob("*.creds"))]
    for path in sorted(out.rglob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")).get("stringData") or {}
        texts += [data[key] for key in ("creds", "leaf.creds") if key in data]
    for text in texts:
        try:
            claims = jwt.decode(jwt.creds_jwt(text), {authority.account_signer.public})
        except jwt.JwtError:
            continue
        found[str(claims["sub"])] = str(claims["name"])
    return found


async def push_deploy_revocations(
    revoked: Revoked, nats_url: str, now: int, tls_ca: str | None = None
) -> None:
    """Push every key the authority revoked so far to the hub's NATS resolver (a SYS user
    minted for it): the hub cluster closes their connections at once and keeps refusing them.
    Raises bus.issuer.IssuerError when the server cannot be reached or refuses."""
    authority = revoked.authority
    await push_revocations(
        nats_url,
        system_creds=authority.issue_system(now).creds,
        operator_signer=authority.operator_signer,
        account=authority.account.public,
        revoke=authority.revocations(),
        now=now,
        tls_ca=tls_ca,
    )


def _check_spoke(spoke: str) -> None:
    if not re.fullmatch(SPOKE_ID_PATTERN, spoke):
        raise ValueError(f"{spoke!r} is not a spoke id (letters, digits, '_' and '-')")


def _spoke(folder: Path, authority: NatsAuthority, spoke: str, url: str, now: int) -> list[Path]:
    """A spoke's Secret (its pod mounts it) and the same credential as a `.creds` file (what
    `--nats-creds` reads where there is no pod: a Slurm login node, a bare GPU box)."""
    issued = authority.issue(
        f"spoke-{spoke}", identities.spoke_permissions(spoke), now=now, keep=True
    )
    return [
        _client(folder / f"spoke-{spoke}.yaml", "gpufed-spoke-nats", url, issued.creds),
        write_secret(folder / f"spoke-{spoke}.creds", issued.creds),
    ]


def _leaf_auth(folder: Path, authority: NatsAuthority, hub_leaf_url: str, creds: str) -> Path:
    """A region's Secret gpufed-nats-auth: its leaf's accounts (every revoked key refused),
    the hub's leaf address and the leaf's own credential at the hub."""
    auth = authority.auth_config() + (
        f"GPUFED_ACCOUNT: {authority.account.public}\n{_HUB_LEAF_URL}: {json.dumps(hub_leaf_url)}\n"
    )
    return _secret(
        folder / "nats-auth.yaml", "gpufed-nats-auth", {"auth.conf": auth, "leaf.creds": creds}
    )


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
