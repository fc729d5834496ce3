"""Spot interruption: a cloud spoke that gets EC2's two-minute notice drains before it goes.

The instance metadata service exists only on an instance; here a small stand-in on loopback
serves its two calls (IMDSv2 token, spot/instance-action) and nothing else. Everything else is
real: hub, spokes, nats-server, processes. Each workload appends "start <ns> <id> <node>" and,
when it ends or is stopped, "end <ns> <id>".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hub.core.policy import Policy, Team
from schemas import Phase, SpokeKind
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

TIMED = (
    "trap 'echo \"end $(date +%s%N) $GPUFED_WORKLOAD_ID\" >> {log}; exit 143' TERM; "
    'echo "start $(date +%s%N) $GPUFED_WORKLOAD_ID $GPUFED_NODE" >> {log}; '
    "while [ ! -e {release} ]; do sleep 0.1; done; "
    'echo "end $(date +%s%N) $GPUFED_WORKLOAD_ID" >> {log}'
)


class MetadataStandIn:
    """IMDSv2's token and spot instance-action paths, on a free loopback port."""

    def __init__(self) -> None:
        self.notice: dict[str, str] | None = None
        self.server: asyncio.Server | None = None
        self.polled_with_token = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        method, path, _ = head.split("\r\n")[0].split(" ")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)
        }
        if method == "PUT" and path == "/latest/api/token":
            status, body = 200, "stand-in-token"
        elif headers.get("x-aws-ec2-metadata-token") != "stand-in-token":
            status, body = 401, ""
        elif method == "GET" and path == "/latest/meta-data/spot/instance-action":
            self.polled_with_token += 1
            status, body = (404, "") if self.notice is None else (200, json.dumps(self.notice))
        else:
            status, body = 404, ""
        reason = {200: "OK", 401: "Unauthorized", 404: "Not Found"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n{body}".encode()
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def imds() -> AsyncIterator[MetadataStandIn]:
    stand_in = MetadataStandIn()
    await stand_in.start()
    try:
        yield stand_in
    finally:
        await stand_in.close()


async def test_interruption_notice_drains_the_cloud_spoke_and_its_work_reruns_elsewhere(
    fed: InProcessFederation, imds: MetadataStandIn, tmp_path: Path
) -> None:
    fed.policy = Policy(teams=(Team("drill", may_burst=True),))  # it runs on a cloud spoke
    await fed.start_hub()
    cloud = await fed.start_spoke(
        "burst-1",
        "eu",
        nodes("burst-1", 1, 4, "H100"),
        kind=SpokeKind.CLOUD,
        interruption_imds_url=imds.url,
    )
    await fed.wait_spokes(1)
    log = tmp_path / "runs.log"
    release = tmp_path / "release"  # the jobs run until it exists (after the notice)
    ids = [
        await fed.submit(
            name=f"job-{i}",
            team="drill",
            command=["sh", "-c", TIMED.format(log=log, release=release)],
            restart_policy="never",  # drained work is requeued whatever its restart policy
        )
        for i in range(3)
    ]
    for wid in ids:
        record = await fed.wait_phase(wid, {Phase.RUNNING}, timeout=20)
        assert record["spoke_id"] == "burst-1"
    await fed.start_spoke("onprem-1", "eu", nodes("onprem-1", 1, 4, "H100"))
    await fed.wait_spokes(2)
    await wait_until(lambda: imds.polled_with_token > 0, timeout=20)

    goes_at = datetime.fromtimestamp(time.time() + 120, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    imds.notice = {"action": "terminate", "time": goes_at}
    # Drained: every copy on the cloud spoke was stopped (its TERM trap wrote its end).
    await wait_until(lambda: log.read_text().count("end ") == len(ids), timeout=30)
    release.touch()
    for wid in ids:
        record = await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=90)
        assert record["spoke_id"] == "onprem-1"
        assert record["restarts"] == 0  # preempted, not failed
    assert fed.hub is not None
    report = fed.hub.reports["burst-1"]
    assert not any(n.schedulable for n in report.nodes)  # nothing more is placed there
    assert cloud.draining

    lines = [line.split() for line in log.read_text().splitlines()]
    for wid in ids:
        mine = [line for line in lines if line[2] == wid]
        assert [line[0] for line in mine] == ["start", "end", "start", "end"]
        assert mine[0][3].startswith("burst-1") and mine[2][3].startswith("onprem-1")
        assert int(mine[1][1]) <= int(mine[2][1])  # stopped gracefully before it ran again
