"""`gpufed up`'s supervisor: whatever dies is started again, however often, after a back-off."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpufed.backoff import Backoff
from gpufed.up import Federation, SimSpoke
from tests.integration.conftest import MakeClient, MakeFederation
from tests.support.api import wait_http, wait_terminal
from tests.support.wait import wait_until

FLEET = (SimSpoke("eu-1", "eu", nodes=1, gpus=2, model="H100"),)
#: The give-up limit `gpufed up` had: a sixth exit within a minute ended the federation.
OLD_GIVE_UP = 5


def job(log: Path, name: str) -> dict[str, object]:
    script = f'echo "$GPUFED_WORKLOAD_ID" >> {log}; sleep 0.1'
    return {"name": name, "team": "drill", "command": ["sh", "-c", script]}


async def supervise_until_up(fed: Federation, names: set[str], said: list[str]) -> None:
    """Run the supervisor (as `gpufed up` does) until all of `names` run again."""

    def up() -> bool:
        said.extend(fed.supervise())
        running = {n for n, p in fed.procs.items() if p.poll() is None}
        if not fed.nats.exited:
            running.add("nats")
        return names <= running

    await wait_until(up, 60, f"{sorted(names)} to run again", every=0.05)


async def test_embedded_federation_starts_again_what_dies(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    fed = make_fed(FLEET)
    fed.start_hub()
    fed.start_spoke(fed.spoke("eu-1"))
    client = api(fed)
    await wait_http(client, {"eu-1"})
    # Killed from outside (an OOM killer, a person): our handles stay, the processes go.
    for proc in (fed.procs["hub"], fed.procs["eu-1"]):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert fed.nats.pid is not None
    os.kill(fed.nats.pid, signal.SIGKILL)
    await wait_until(lambda: fed.nats.exited, 10, "nats-server to exit")
    said: list[str] = []
    await supervise_until_up(fed, {"nats", "hub", "eu-1"}, said)
    assert sorted(line.split()[0] for line in said) == ["eu-1", "hub", "nats"]
    await wait_http(client, {"eu-1"})
    log = tmp_path / "runs.log"
    wid = (await client.post("/v1/workloads", json=job(log, "after"))).json()["id"]
    records = await wait_terminal(client, {wid}, timeout=30)
    assert records[wid]["phase"] == "succeeded"


async def test_a_hub_killed_again_and_again_keeps_coming_back(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    # A short back-off keeps the test quick; the schedule itself has unit tests.
    fed = make_fed(FLEET, backoff=Backoff(base_s=0.05, cap_s=0.4, reset_after_s=600))
    fed.start_hub()
    fed.start_spoke(fed.spoke("eu-1"))
    client = api(fed)
    await wait_http(client, {"eu-1"})
    said: list[str] = []
    pids = {fed.procs["hub"].pid}
    for _ in range(OLD_GIVE_UP + 3):
        hub = fed.procs["hub"]
        os.kill(hub.pid, signal.SIGKILL)  # by its PID, as a person would
        await wait_until(lambda: hub.poll() is not None, 10, "the hub to die")  # noqa: B023
        await supervise_until_up(fed, {"hub"}, said)
        pids.add(fed.procs["hub"].pid)
    assert len(pids) == OLD_GIVE_UP + 4  # a new hub process each time
    # Once per back-off step, each step saying how many crashes in a row it counts.
    assert [line.split("(")[1].split()[0] for line in said] == [
        str(n) for n in range(1, OLD_GIVE_UP + 4)
    ]
    assert "again in 0.4s" in said[-1]  # the wait stopped growing at the cap
    await wait_http(client, {"eu-1"})
    log = tmp_path / "runs.log"
    wid = (await client.post("/v1/workloads", json=job(log, "after"))).json()["id"]
    records = await wait_terminal(client, {wid}, timeout=30)
    assert records[wid]["phase"] == "succeeded"
