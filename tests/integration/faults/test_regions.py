"""Regional leaf nodes, run for real: a hub nats-server, two leaf nats-servers (JetStream domains
"eu" and "us"), spokes on their region's leaf, and the WAN link of one region cut for a minute.

Each workload appends "start <ns> <id> <node>" and "end <ns> <id>" to one file: the workloads'
own record of how often, and where, they ran.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats.js.errors
import pytest

from bus.client import Bus, BusSettings
from bus.natsserver import EmbeddedNats
from bus.ports import free_port
from schemas import Phase, parse_events, subjects
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.proxy import CuttableProxy
from tests.support.wait import wait_until

TIMED = (
    "trap 'echo \"end $(date +%s%N) $GPUFED_WORKLOAD_ID\" >> {log}; exit 143' TERM; "
    'echo "start $(date +%s%N) $GPUFED_WORKLOAD_ID $GPUFED_NODE" >> {log}; '
    "sleep {secs} & wait $!; "
    'echo "end $(date +%s%N) $GPUFED_WORKLOAD_ID" >> {log}'
)
#: Longer than a minute, shorter than the hub's lost_after (120 s).
CUT_S = 65.0


@dataclass
class Regions:
    hub: EmbeddedNats
    leaves: dict[str, EmbeddedNats]
    links: dict[str, CuttableProxy]  # each leaf dials the hub through its own cuttable link


@pytest.fixture
async def regions(tmp_path: Path) -> AsyncIterator[Regions]:
    leaf_port = free_port()
    hub = EmbeddedNats(tmp_path / "nats-hub", domain="hub", leaf_port=leaf_port).start()
    made = Regions(hub, {}, {})
    try:
        for region in ("eu", "us"):
            link = CuttableProxy("127.0.0.1", leaf_port)
            await link.start()
            made.links[region] = link
            remote = f"nats-leaf://127.0.0.1:{link.port}"
            made.leaves[region] = EmbeddedNats(
                tmp_path / f"nats-{region}", domain=region, leaf_remote=remote
            ).start()
        yield made
    finally:
        for link in made.links.values():
            await link.close()
        for leaf in made.leaves.values():
            leaf.stop()
        hub.stop()


@pytest.fixture
def federation(regions: Regions, tmp_path: Path) -> Iterator[InProcessFederation]:
    yield InProcessFederation(regions.hub.url, tmp_path)


async def set_up_region(leaf: EmbeddedNats, spokes: tuple[str, ...]) -> None:
    """What `gpufed region-streams` does on a leaf node."""
    bus = Bus(BusSettings(url=leaf.url, name="setup"))
    await bus.connect()
    try:
        await bus.ensure_regional_streams("hub", spokes)
    finally:
        await bus.close()


def runs(log: Path) -> dict[str, list[tuple[str, int, str]]]:
    found: dict[str, list[tuple[str, int, str]]] = {}
    for line in log.read_text().splitlines():
        what, t, wid, *node = line.split()
        found.setdefault(wid, []).append((what, int(t), node[0] if node else ""))
    return found


async def test_a_region_cut_off_for_a_minute_works_on_and_reconciles(
    regions: Regions, federation: InProcessFederation, tmp_path: Path
) -> None:
    fed = federation
    try:
        # The regions come up before the hub (as they may in production): their setup waits
        # for the hub's command stream before mirroring it.
        setups = [
            asyncio.create_task(set_up_region(regions.leaves["eu"], ("eu-1",))),
            asyncio.create_task(set_up_region(regions.leaves["us"], ("us-1",))),
        ]
        for leaf in regions.leaves.values():
            await leaf_stream_exists(leaf, subjects.EVENTS_STREAM)
        assert not any(t.done() for t in setups)  # no hub stream yet: no mirror either
        await fed.start_hub(event_domains=("eu", "us"))
        await asyncio.gather(*setups)
        await fed.start_spoke(
            "eu-1", "eu", nodes("eu-1", 1, 8, "H100"), nats_url=regions.leaves["eu"].url
        )
        await fed.start_spoke(
            "us-1", "us", nodes("us-1", 1, 8, "H100"), nats_url=regions.leaves["us"].url
        )
        await fed.wait_spokes(2, timeout=30)
        log = tmp_path / "runs.log"

        async def submit(region: str, name: str, secs: float) -> str:
            return await fed.submit(
                name=name,
                team="drill",
                command=["sh", "-c", TIMED.format(log=log, secs=secs)],
                affinity={"required_regions": [region]},
            )

        # Before the cut: work in both regions, some of it ending while eu is cut off.
        during = [await submit("eu", f"eu-during-{i}", 20) for i in range(3)]
        to_cancel = await submit("eu", "eu-cancel", 300)
        us_before = [await submit("us", f"us-{i}", 1) for i in range(3)]
        for wid in [*during, to_cancel]:
            await fed.wait_phase(wid, {Phase.RUNNING}, timeout=30)

        await regions.links["eu"].cut()
        # Commands published while the link is down: a placement and a cancellation.
        late = await submit("eu", "eu-late", 2)
        await fed.wait_phase(late, {Phase.PLACED}, timeout=10)
        assert fed.hub is not None
        await fed.hub.cancel(to_cancel)
        # The other region carries on meanwhile.
        us_meanwhile = [await submit("us", f"us-m{i}", 1) for i in range(3)]
        for wid in [*us_before, *us_meanwhile]:
            await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=30)

        # The cut region works on: its work ends and its events wait in its own stream.
        await asyncio.sleep(25)
        eu_events = await leaf_stream_events(regions.leaves["eu"])
        assert eu_events >= 6  # running and succeeded of the three ending during the cut
        for wid in during:
            assert (await fed.workload(wid))["phase"] == "running"  # the hub has not heard yet
        assert not any(w == late for w in runs(log))  # its Place is still on the other side
        await asyncio.sleep(CUT_S - 25)

        await regions.links["eu"].restore()
        for wid in during:
            await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=90)
        await fed.wait_phase(late, {Phase.SUCCEEDED}, timeout=90)
        await fed.wait_phase(to_cancel, {Phase.CANCELLED}, timeout=90)
        await wait_until(lambda: all(s.counters["syncs"] > 1 for s in fed.spokes.values()), 60)
    finally:
        await fed.close()

    found = runs(log)
    everything = [*during, to_cancel, late, *us_before, *us_meanwhile]
    starts = Counter(
        {w: sum(1 for what, _, _ in found.get(w, []) if what == "start") for w in everything}
    )
    assert starts == Counter(dict.fromkeys(everything, 1))  # each ran exactly once
    assert all(found[w][0][2].startswith("eu-1") for w in [*during, to_cancel, late])


def test_region_streams_without_a_reachable_hub_says_so_and_mirrors_nothing(
    tmp_path: Path,
) -> None:
    leaf = EmbeddedNats(tmp_path / "nats-eu", domain="eu").start()  # linked to no hub
    try:
        flags = ["--nats-url", leaf.url, "--spoke", "eu-1", "--wait-for-hub", "1"]
        done = subprocess.run(
            [sys.executable, "-m", "gpufed", "region-streams", *flags],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1
        assert "GPUFED_COMMANDS (JetStream domain 'hub')" in done.stderr
        assert "is this leaf node linked to it?" in done.stderr

        async def streams() -> tuple[bool, bool]:
            bus = Bus(BusSettings(url=leaf.url, name="look"))
            await bus.connect()
            try:
                await bus.js.stream_info(subjects.EVENTS_STREAM)
                try:
                    await bus.js.stream_info(subjects.COMMANDS_STREAM)
                    return True, True
                except nats.js.errors.NotFoundError:
                    return True, False
            finally:
                await bus.close()

        assert asyncio.run(streams()) == (True, False)  # events kept locally; no dead mirror
    finally:
        leaf.stop()


async def leaf_stream_events(leaf: EmbeddedNats) -> int:
    """How many events a leaf's events stream holds (a message holds one or several)."""
    bus = Bus(BusSettings(url=leaf.url, name="look"))
    await bus.connect()
    try:
        state = (await bus.js.stream_info(subjects.EVENTS_STREAM)).state
        count = 0
        for seq in range(state.first_seq, state.first_seq + state.messages):
            msg = await bus.js.get_msg(subjects.EVENTS_STREAM, seq)
            count += len(parse_events(msg.data or b""))
        return count
    finally:
        await bus.close()


async def leaf_stream_exists(leaf: EmbeddedNats, stream: str) -> None:
    bus = Bus(BusSettings(url=leaf.url, name="look"))
    await bus.connect()
    try:
        await asyncio.wait_for(bus.wait_for_stream(stream), 30)
    finally:
        await bus.close()
