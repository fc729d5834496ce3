"""One caller's flood of requests does not take the hub from the others: past its burst and
rate it is answered 429 with Retry-After. A real hub on a real nats-server, real tokens."""

from __future__ import annotations

import asyncio
import time

from gpufed.client import HubClient
from tests.integration.fed import InProcessFederation


async def test_a_caller_past_its_rate_is_refused_and_told_when_to_come_back(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub(api_rate_per_s=5.0, api_burst=10)
    mia = fed.client(await fed.token("mia", "member", "vision"))
    olaf = fed.client(await fed.token("olaf", "member", "nlp"))
    try:
        for _ in range(10):
            assert (await mia.get("/v1/workloads")).status_code == 200
        refused = await mia.get("/v1/workloads")
        assert refused.status_code == 429
        body = refused.json()
        assert (body["code"], body["retryable"]) == ("rate_limited", True)
        assert body["message"].startswith("mia made more than 10 requests at once or 5 a second")
        assert refused.headers["Retry-After"] == "1"
        submit = await mia.post(
            "/v1/workloads", json={"name": "j", "team": "vision", "command": ["true"]}
        )
        assert submit.status_code == 429  # writes count too
        assert (await olaf.get("/v1/workloads")).status_code == 200  # others are not held
        for _ in range(30):  # the platform team is never limited
            assert (await fed.api.get("/v1/workloads")).status_code == 200
        await asyncio.sleep(0.3)  # a request's worth refills in 0.2 s
        assert (await mia.get("/v1/workloads")).status_code == 200
    finally:
        await mia.aclose()
        await olaf.aclose()


async def test_a_hub_told_not_to_limit_answers_every_request(fed: InProcessFederation) -> None:
    await fed.start_hub(api_rate_per_s=0)  # `gpufed hub --api-rate 0`
    mia = fed.client(await fed.token("mia", "member", "vision"))
    try:
        codes = {(await mia.get("/v1/workloads")).status_code for _ in range(250)}
        assert codes == {200}
    finally:
        await mia.aclose()


async def test_the_cli_waits_as_told_and_its_requests_go_through(fed: InProcessFederation) -> None:
    await fed.start_hub(api_rate_per_s=2.0, api_burst=3)
    token = await fed.token("mia", "member", "vision")
    async with fed.serve() as url:
        client = HubClient(url, token=token)
        try:
            started = time.monotonic()
            # 3 at once, then 2 a second: the 4th is refused, waited for, and sent again
            answers = await asyncio.to_thread(lambda: [client.workloads() for _ in range(6)])
            waited = time.monotonic() - started
        finally:
            client.close()
    assert answers == [[]] * 6  # every `gpufed jobs` answered, none refused
    assert waited >= 1.0  # it waited at least the Retry-After it was told
