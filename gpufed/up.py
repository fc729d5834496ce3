"""`gpufed up`'s federation: NATS, the hub(s) and three simulated spokes on this machine.

Every piece runs as its own process, as in production, and is stopped by its own handle.
`gpufed.up_command` is the command around it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from nats.aio.client import RawCredentials

from burst.catalog import load_catalog
from burst.providers.local import STATE_FILE, LocalProvider
from bus import identities, lifeline
from bus.authority import NatsAuthority, write_secret
from bus.client import BusSettings
from bus.jwt import Permissions
from bus.natsserver import EmbeddedNats
from bus.ports import claim_port, free_port
from bus.processes import ends_with_us, stop_process, stop_processes
from bus.tls import TlsFiles, ensure_local_ca
from gpufed.backoff import Backoff, crashes_in_a_row, restart_delay
from gpufed.client import ApiError, HubClient
from gpufed.logfiles import rotate_all


@dataclass(frozen=True)
class SimSpoke:
    id: str
    region: str
    nodes: int
    gpus: int
    model: str
    price: float = 0.0  # $ per GPU-hour (what service requests are priced at)


#: The embedded fleet: two regions, three spokes, three GPU models. The L4s carry an amortised
#: price so inference services running there show a cost per 1,000 requests; us-1 already
#: comes last among equal offers (by id), so the price changes no placement.
FLEET = (
    SimSpoke("eu-1", "eu", nodes=2, gpus=8, model="H100"),
    SimSpoke("eu-2", "eu", nodes=1, gpus=4, model="A100"),
    SimSpoke("us-1", "us", nodes=4, gpus=8, model="L4", price=0.8),
)


#: A piece that dies is started again after 0.5 s, 1 s, 2 s ... at most 10 s apart, for ever.
RESTART_BACKOFF = Backoff(base_s=0.5, cap_s=10.0, reset_after_s=60.0)
#: How often `supervise` rotates the pieces' logs that grew past gpufed.logfiles.MAX_LOG_BYTES.
LOGS_CHECKED_EVERY_S = 10.0

#: The policy a new embedded federation starts with: every team may burst onto the simulated
#: cloud, within a budget. (A real hub's default lets no unlisted team burst.) Seeded into the
#: store on first start only, so `gpufed policy set` changes survive restarts.
UP_POLICY: dict[str, object] = {
    "default_team": {"may_burst": True},
    "burst": {"dollars_per_hour": 250.0},
}

#: Burst timings of the demo: rent after 3 s of unplaceable demand, give back after 6 s idle.
DEMO_BURST = (
    "--tick", "0.5", "--burst-after", "3", "--idle-ttl", "6", "--cooldown", "5",
    "--max-instances", "2",
)  # fmt: skip


class Federation:
    """The processes of an embedded federation."""

    def __init__(
        self,
        data_dir: Path,
        api_port: int,
        fleet: tuple[SimSpoke, ...] = FLEET,
        *,
        hub_args: tuple[str, ...] = (),
        store_url: str | None = None,
        spoke_args: tuple[str, ...] = ("--stop-workloads-on-exit",),
        burst_args: tuple[str, ...] | None = None,
        backoff: Backoff = RESTART_BACKOFF,
        tls: bool = False,
        policy: dict[str, object] | None = None,
        tied: bool = False,
    ) -> None:
        """`tied`: every piece gets SIGTERM when this process dies, even by SIGKILL (what
        `gpufed up` wants; start and supervise from the main thread then)."""
        self.data_dir = data_dir.resolve()
        self.fleet = fleet
        self.hub_args = hub_args
        self.spoke_args = spoke_args
        self.burst_args = burst_args  # None: no burst controller
        self.policy = UP_POLICY if policy is None else policy
        self.admin_token = ""  # minted (or read back) by start()
        if api_port:
            claim_port(api_port)  # no spoke's /metrics gets it before the hub binds it
        self.api_port = api_port or free_port()
        # Each hub replica's API port, kept across its restarts: "hub" leads at first.
        self.hub_ports: dict[str, int] = {"hub": self.api_port}
        # NATS always runs with auth: every process gets its own confined credential as a
        # file only its owner reads (never in argv); with `tls` clients also check a local CA.
        self.secrets_dir = self.data_dir / "secrets"
        self.secrets_dir.mkdir(parents=True, exist_ok=True)
        self.secrets_dir.chmod(0o700)
        self.authority = NatsAuthority.open(self.secrets_dir / "nats", int(time.time()))
        # The hubs' shared store (PostgreSQL; None: each hub's own SQLite). Its URL holds a
        # password, so the hubs read it from a file only its owner reads, never from argv.
        self.store_url = store_url
        if store_url is not None:
            write_secret(self.store_url_file, store_url + "\n")
        self.tls: TlsFiles | None = ensure_local_ca(self.secrets_dir / "tls") if tls else None
        self._preexec = ends_with_us() if tied else None
        # The read end of a pipe whose write end stays open here, unnamed, until this process
        # ends: handed to burst and on to its cloud spokes, which outlive a burst restart but
        # not us (`bus.lifeline`).
        self._lifeline = lifeline.make()[0] if tied else None
        self.nats = EmbeddedNats(
            self.data_dir / "nats", authority=self.authority, tls=self.tls, preexec=self._preexec
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._started: list[subprocess.Popen[bytes]] = []  # everything we spawned, in order
        self.backoff = backoff
        self._started_at: dict[str, float] = {}  # piece -> time.monotonic() of its last start
        self._logs_checked_at = float("-inf")  # the logs' sizes (gpufed.logfiles)
        self._crashes: dict[str, int] = {}  # piece -> crashes in a row
        self._restart_at: dict[str, float] = {}  # piece -> when to start it again
        # Spokes that reach NATS another way (a regional leaf, a cuttable link), on restarts too.
        self.spoke_nats: dict[str, str] = {}
        # Prometheus /metrics of each spoke and of burst (the hub's is on its API port).
        self.metrics_ports: dict[str, int] = {}
        self.spawning = False  # inside _spawn: a stop signal waits (see _spawn)
        self.interrupted = False  # a stop signal came while spawning

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def token_file(self) -> Path:
        """Where the admin token is kept (mode 0600); the CLI reads it from here."""
        return self.data_dir / "admin.token"

    @property
    def store_url_file(self) -> Path:
        return self.secrets_dir / "store-url"

    def start(self, timeout_s: float = 60.0, hubs: int = 1) -> None:
        """Start NATS, `hubs` hub replicas (more than one needs a shared `store_url`), the
        spokes and burst; return once a hub leads and every spoke has reported."""
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._start_nats()
        self.start_hub()
        for n in range(2, hubs + 1):
            self.start_hub_replica(f"hub-{n}")
        for spoke in self.fleet:
            self.start_spoke(spoke)
        if self.burst_args is not None:
            self.start_burst()
        self.wait_ready(timeout_s)

    def bootstrap(self) -> str:
        """Bring the hub's store up to date, seed the policy on first start, and return the
        admin token (minted on first start and written to `token_file`)."""
        from hub.authstore import AuthStore
        from hub.service import POLICY_KEY
        from hub.store import Store
        from hub.tokens import ensure_admin_token

        url = self.store_url
        store = Store(url) if url else Store.sqlite(self.data_dir / "hub" / "hub.db")
        try:
            if store.get_setting(POLICY_KEY) is None and self.policy:
                from hub.policyfile import policy_from_dict, policy_to_dict

                document = json.dumps(policy_to_dict(policy_from_dict(dict(self.policy))))
                store.put_setting(POLICY_KEY, document, time.time())
            return ensure_admin_token(AuthStore(store.engine), self.token_file, time.time())
        finally:
            store.close()

    @property
    def api_urls(self) -> list[str]:
        """Every hub replica's API URL (the first hub's first)."""
        return [f"http://127.0.0.1:{port}" for port in self.hub_ports.values()]

    def client(self, timeout_s: float = 10.0) -> HubClient:
        """A REST client of this federation's hubs (it follows the leader), with the admin
        token."""
        return HubClient(",".join(self.api_urls), timeout_s=timeout_s, token=self.admin_token)

    def start_burst(self) -> None:
        """The burst controller with the local provider: cloud spokes are local processes."""
        port = self.metrics_ports.setdefault("burst", free_port())
        self._spawn(
            "burst",
            [
                "burst",
                "--provider", "local",
                "--nats-url", self.nats.url,
                *self.burst_nats_args(),
                "--state-dir", str(self.burst_dir),
                "--spoke-heartbeat", "1",
                "--metrics-port", str(port),
                *(self.burst_args or ()),
            ],
            lifeline.handing(self._lifeline),
        )  # fmt: skip

    @property
    def burst_dir(self) -> Path:
        return self.data_dir / "burst"

    def start_hub(self, name: str = "hub") -> None:
        """Start (or start again) the hub replica `name` on its own API port."""
        if not self.admin_token:  # the first start: store schema, policy seed, admin token
            self.admin_token = self.bootstrap()
        self._spawn(
            name,
            [
                "hub",
                "--nats-url", self.nats.url,
                *self.nats_args(identities.HUB, identities.hub_permissions()),
                "--data-dir", str(self.data_dir / name),
                "--api-port", str(self.hub_ports[name]),
                *(("--store-url-file", str(self.store_url_file)) if self.store_url else ()),
                *self.hub_args,
            ],
        )  # fmt: skip

    def start_hub_replica(self, name: str) -> int:
        """Another hub on the same store (PostgreSQL): a standby until the leader goes.

        Returns its API port (the same on every restart).
        """
        port = self.hub_ports.setdefault(name, free_port())
        self.write_scrape_targets()
        self.start_hub(name)
        return port

    def start_spoke(self, spoke: SimSpoke, nats_url: str | None = None) -> None:
        inventory = self.data_dir / "inventories" / f"{spoke.id}.yaml"
        inventory.parent.mkdir(parents=True, exist_ok=True)
        nodes = {
            "prefix": f"{spoke.id}-n",
            "count": spoke.nodes,
            "gpu_model": spoke.model,
            "gpu_count": spoke.gpus,
        }
        inventory.write_text(yaml.safe_dump({"nodes": [nodes]}))
        port = self.metrics_ports.setdefault(spoke.id, free_port())
        self.write_scrape_targets()
        self._spawn(
            spoke.id,
            [
                "spoke",
                "--id", spoke.id,
                "--region", spoke.region,
                "--nats-url", nats_url or self.spoke_nats.get(spoke.id) or self.nats.url,
                *self.nats_args(f"spoke-{spoke.id}", identities.spoke_permissions(spoke.id)),
                "--inventory", f"static:{inventory}",
                "--runtime", "local",
                "--state-dir", str(self.data_dir / "spokes"),
                "--heartbeat", "1",
                "--metrics-port", str(port),
                *(("--price", str(spoke.price)) if spoke.price else ()),
                *self.spoke_args,
            ],
        )  # fmt: skip

    def nats_args(self, name: str, permissions: Permissions) -> list[str]:
        """`--nats-creds FILE` (a fresh credential for `name`) and `--nats-ca` with TLS."""
        issued = self.authority.issue(name, permissions, now=int(time.time()))
        creds = write_secret(self.secrets_dir / "creds" / f"{name}.creds", issued.creds)
        args = ["--nats-creds", str(creds)]
        if self.tls is not None:
            args += ["--nats-ca", str(self.tls.ca_file)]
        return args

    def burst_nats_args(self) -> list[str]:
        """The burst controller's own credential and the issuer of its instances' ones."""
        issuer = self.authority.write_issuer(
            self.secrets_dir / "burst-issuer.json", int(time.time())
        )
        return [
            *self.nats_args(identities.BURST, identities.burst_permissions()),
            "--nats-issuer", str(issuer),
        ]  # fmt: skip

    def client_settings(self, name: str) -> BusSettings:
        """Bus settings for a tool or test that acts with the hub's rights (in memory)."""
        issued = self.authority.issue(name, identities.hub_permissions(), now=int(time.time()))
        return BusSettings(
            url=self.nats.url,
            name=name,
            user_credentials=RawCredentials(issued.creds),
            inbox_prefix=identities.inbox_prefix(identities.HUB),
            tls_ca=str(self.tls.ca_file) if self.tls else None,
        )

    def write_scrape_targets(self) -> Path:
        """Prometheus file discovery of every /metrics here (see deploy/prometheus/)."""
        hubs = [f"127.0.0.1:{port}" for port in self.hub_ports.values()]
        groups: list[dict[str, object]] = [{"targets": hubs, "labels": {"job": "gpufed-hub"}}]
        for name, port in sorted(self.metrics_ports.items()):
            job = "gpufed-burst" if name == "burst" else "gpufed-spoke"
            groups.append({"targets": [f"127.0.0.1:{port}"], "labels": {"job": job}})
        path = self.data_dir / "prometheus-targets.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(groups, indent=2) + "\n")
        return path

    def wait_ready(self, timeout_s: float) -> None:
        """Until a hub leads and every spoke has reported to it."""
        clients = [HubClient(url, timeout_s=2.0, token=self.admin_token) for url in self.api_urls]
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                self._check_alive()
                for client in clients:
                    with contextlib.suppress(ApiError):
                        if not client.health()["ok"]:
                            continue  # a standby
                        ready = [s for s in client.spokes() if s["status"] == "ready"]
                        if len(ready) >= len(self.fleet):
                            return
                time.sleep(0.2)
        finally:
            for client in clients:
                client.close()
        raise RuntimeError(f"federation not ready after {timeout_s:.0f}s; see {self.log_dir}")

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    def stop(self) -> None:
        """Stop burst and its cloud spokes, the spokes, the hub, then NATS; each by its handle."""
        self._restart_at.clear()
        burst = self.procs.pop("burst", None)
        if burst is not None:
            stop_process(burst, 20)
        self._release_cloud_spokes()
        hubs = [p for name in self.hub_ports if (p := self.procs.pop(name, None)) is not None]
        ordered = [*self.procs.values(), *hubs]  # the hubs hear the spokes stop
        stop_processes(ordered + [p for p in self._started if p not in ordered], 10)
        self.procs.clear()
        self.nats.stop()

    def _release_cloud_spokes(self) -> None:
        # Cloud spokes outlive the controller on purpose (like rented machines); the embedded
        # federation gives them back when it stops.
        state = self.burst_dir / STATE_FILE
        if not state.exists():
            return
        ids = list(json.loads(state.read_text()).get("instances", {}))
        if ids:
            provider = LocalProvider(self.burst_dir, self.nats.url, load_catalog())
            # stop() may be called from inside an event loop (tests, benches): use a thread.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, provider.terminate(ids)).result()

    def kill(self, name: str) -> None:
        """SIGKILL one of our processes (for fault drills)."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def spoke(self, spoke_id: str) -> SimSpoke:
        return next(s for s in self.fleet if s.id == spoke_id)

    def _spawn(self, name: str, args: list[str], handed: lifeline.Handed = lifeline.NONE) -> None:
        # `gpufed up` turns a stop signal into KeyboardInterrupt; landing between the fork and
        # the line that records the process, it would leave a piece stop() never hears of.
        # Its handler defers the interrupt while `spawning` (see gpufed.up_command).
        self.spawning = True
        try:
            log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpufed", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=self._preexec,
                pass_fds=handed.pass_fds,
                env=handed.env,
            )
            log.close()
            self.procs[name] = proc
            self._started.append(proc)
            self._started_at[name] = time.monotonic()
        finally:
            self.spawning = False
        if self.interrupted:
            raise KeyboardInterrupt

    def supervise(self, now: float | None = None) -> list[str]:
        """Start again, after its back-off, whatever died (NATS, the hub, a spoke, burst).

        Never gives up: the wait doubles with each crash in a row up to `backoff.cap_s`.
        Returns one line per back-off step taken, for the terminal.
        """
        now = time.monotonic() if now is None else now
        said = []
        if now - self._logs_checked_at >= LOGS_CHECKED_EVERY_S:
            self._logs_checked_at = now
            rotate_all([*self.log_dir.glob("*.log"), self.nats.log_file])
        if self.nats.exited and "nats" not in self._restart_at:
            said.append(self._schedule("nats", f"exited with {self.nats.returncode}", now))
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            del self.procs[name]
            said.append(self._schedule(name, f"exited with {proc.returncode}", now))
        for name, due in list(self._restart_at.items()):
            if due > now:
                continue
            del self._restart_at[name]
            try:
                self._restart(name)
            except (OSError, RuntimeError) as exc:  # NatsServerError is a RuntimeError
                said.append(self._schedule(name, f"did not start ({exc})", time.monotonic()))
        return said

    def _schedule(self, name: str, what: str, now: float) -> str:
        up_for = now - self._started_at.get(name, now)
        crashes = crashes_in_a_row(self.backoff, self._crashes.get(name, 0), up_for)
        self._crashes[name] = crashes
        delay = restart_delay(self.backoff, crashes)
        self._restart_at[name] = now + delay
        log_file = self.nats.log_file if name == "nats" else self.log_dir / f"{name}.log"
        return (
            f"{name} {what}; starting it again in {delay:g}s ({crashes} in a row; see {log_file})"
        )

    def _restart(self, name: str) -> None:
        if name == "nats":
            self._start_nats()
        elif name in self.hub_ports:
            self.start_hub(name)
        elif name == "burst":
            self.start_burst()
        else:
            self.start_spoke(self.spoke(name))

    def _start_nats(self) -> None:
        self._started_at["nats"] = time.monotonic()
        self.nats.start()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}; see {self.log_dir / (name + '.log')}"
                )
