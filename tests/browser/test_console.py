"""The web console in Debian's Chromium: every page, against a live federation, with screenshots."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hub.core.policy import Policy, Quota, Team
from schemas import Phase
from schemas.burst import BURST_VERDICTS, BurstVerdict, BurstVerdicts, InstanceState
from tests.browser.conftest import LiveHub
from tests.integration.fed import nodes
from tests.support.instances import publish_instance
from tests.support.wait import wait_until as until

POLICY = Policy(
    teams=(
        Team("vision", quotas={"H100": Quota(guaranteed=4, limit=8)}),
        Team("nlp", quotas={"H100": Quota(guaranteed=2, limit=4)}),
    )
)


async def test_every_console_page_shows_the_live_federation(
    live_hub: LiveHub, browser_context: Any, screenshots: Path
) -> None:
    fed = live_hub.fed
    await live_hub.start(POLICY)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.start_spoke("us-1", "us", nodes("us-1", 1, 2, "L4"))
    await fed.wait_spokes(2)
    hub = fed.hub
    assert hub is not None
    train = await fed.submit(
        name="train", team="vision", gpus_per_node=4, gpu_models=["H100"], command=["sleep", "300"]
    )
    await fed.wait_phase(train, {Phase.RUNNING})
    wait_a = await fed.submit(
        name="wait-a", team="nlp", gpus_per_node=2, gpu_models=["H100"], command=["true"]
    )
    wait_b = await fed.submit(
        name="wait-b", team="nlp", gpus_per_node=1, gpu_models=["H100"], command=["true"]
    )
    await until(lambda: wait_a in hub.positions and wait_b in hub.positions)
    await rent_an_instance(live_hub)

    page = await browser_context.new_page()
    requests: list[Any] = []
    page.on("request", lambda r: requests.append(r) if "/v1/" in r.url else None)
    await page.goto(live_hub.url + "/")
    await log_in(page, fed.admin_token)
    requests.clear()  # from here on every call must carry the token
    requests.clear()

    # Fleet: both spokes ready, the H100s all in use.
    await page.wait_for_selector("#spokes tr[data-spoke='eu-1'] .status.ready")
    await page.wait_for_selector("#spokes tr[data-spoke='us-1'] .status.ready")
    await page.wait_for_selector(".card[data-model='H100']:has-text('0 free / 4')")
    assert "L4 2/2" in await page.inner_text("#spokes tr[data-spoke='us-1']")
    await shoot(page, screenshots, "fleet")

    # Queue: in the order the scheduler looks at it, with the reason each waits.
    await page.click("nav a[href='/queue']")
    await page.wait_for_selector(f"#queue tr[data-id='{wait_b}']")
    rows = await page.query_selector_all("#queue tbody tr")
    first = [await c.inner_text() for c in await rows[0].query_selector_all("td")]
    second = [await c.inner_text() for c in await rows[1].query_selector_all("td")]
    assert (first[0], first[2], second[0], second[2]) == ("1", "wait-a", "2", "wait-b")
    assert first[8] != "-" and first[9]  # a reason code and its sentence
    await shoot(page, screenshots, "queue")

    # My jobs: submit through the form, watch it run, read its events and log, cancel it.
    await page.click("nav a[href='/jobs']")
    await page.fill("#submit-form [name=name]", "hello")
    await page.fill("#submit-form [name=team]", "vision")
    await page.fill("#submit-form [name=gpu_model]", "L4")
    await page.fill(
        "#submit-form [name=command]", "for i in 1 2 3; do echo hello-$i; done; sleep 300"
    )
    await page.click("#submit-form button[type=submit]")
    await page.wait_for_selector("#submit-result:has-text('Submitted')")
    job = (await page.inner_text("#submit-result")).split()[-1]
    await page.wait_for_selector(f"#jobs tr[data-id='{job}'] .phase.running")
    await page.wait_for_selector("#job-log:has-text('hello-3')")
    assert "hello-1\nhello-2\nhello-3" in await page.inner_text("#job-log")
    events = await page.inner_text("#job-events")
    assert "submitted" in events and "placed" in events and "running on us-1" in events
    # A queued job's row says how long it has waited so far and why it waits.
    cells = await page.query_selector_all(f"#jobs tr[data-id='{wait_a}'] td")
    waited, why = [await c.inner_text() for c in cells[6:9:2]]
    assert waited != "-" and why == (await fed.workload(wait_a))["message"] and why
    await shoot(page, screenshots, "jobs")
    await page.click(f"#jobs tr[data-id='{job}'] button.cancel")
    await page.wait_for_selector(f"#jobs tr[data-id='{job}'] .phase.cancelled")
    assert (await fed.workload(job))["phase"] == "cancelled"

    # Teams: guarantee against use; nlp waits below its guarantee.
    await page.click("nav a[href='/teams']")
    await page.wait_for_selector("#teams tr[data-team='nlp']")
    vision = [
        await c.inner_text()
        for c in await page.query_selector_all("#teams tr[data-team='vision'] td")
    ]
    nlp = [
        await c.inner_text() for c in await page.query_selector_all("#teams tr[data-team='nlp'] td")
    ]
    assert vision[1:4] == ["4", "4", "0"]  # guaranteed, using, borrowing
    assert nlp[1:3] == ["2", "0"] and nlp[5] == "2"  # guaranteed, using; 2 queued
    assert vision[7].startswith("$") and vision[7] != "$0.00"  # the rented instance's bill
    await shoot(page, screenshots, "teams")

    # Burst: the instance, its state and what it has cost so far.
    await page.click("nav a[href='/burst']")
    await page.wait_for_selector("#instances tr[data-id='burst-test-1'] .status.running")
    assert await page.inner_text("#burst-live") == "1"
    assert (await page.inner_text("#burst-total")) != "$0.00"
    await shoot(page, screenshots, "burst")

    # Usage: a line per team over time, and totals that add up.
    await page.click("nav a[href='/usage']")
    await page.wait_for_selector("#chart-gpus polyline[data-team='vision']")
    await page.wait_for_selector("#chart-cost polyline[data-team='vision']")
    await page.wait_for_selector("#usage tr[data-team='vision']")
    await shoot(page, screenshots, "usage")

    # Queue: a job a cloud instance is being rented for says so beside why it waits.
    hub = live_hub.fed.hub
    assert hub is not None
    await publish_instance(
        hub.bus, "burst-test-2", InstanceState.REQUESTED, time.time(), workload_ids=(wait_b,)
    )
    # And one it rents nothing for says why, in the controller's words.
    refused = BurstVerdict(reason="team_budget_spent", message="team vision spent $5.00 of $5.00")
    verdicts = BurstVerdicts(
        provider="local",
        at=time.time(),
        verdicts=(refused.model_copy(update={"workload_ids": (wait_a,)}),),
    )
    await hub.bus.publish(BURST_VERDICTS, verdicts.model_dump_json().encode())
    await page.click("nav a[href='/queue']")
    await page.wait_for_selector(f"#queue tr[data-id='{wait_b}']:has-text('cloud instance')")
    assert "; cloud instance burst-test-2 (sim.l4x2, 2 L4), asked for" in await page.inner_text(
        f"#queue tr[data-id='{wait_b}']"
    )
    await page.wait_for_selector(f"#queue tr[data-id='{wait_a}']:has-text('no cloud instance')")
    assert (
        "; no cloud instance: team vision spent $5.00 of $5.00 [team_budget_spent]"
        in await page.inner_text(f"#queue tr[data-id='{wait_a}']")
    )

    # Fleet: a spoke an operator cordoned says so, and by whom and why on hover.
    assert fed.api is not None
    cordoned = await fed.api.put("/v1/spokes/us-1/cordon", json={"reason": "new rack"})
    assert cordoned.status_code == 200
    await page.click("nav a[href='/']")
    badge = "#spokes tr[data-spoke='us-1'] .status.cordoned"
    await page.wait_for_selector(badge)
    assert await page.get_attribute(badge, "title") == "cordoned by admin: new rack"
    assert "L4 0/2" in await page.inner_text("#spokes tr[data-spoke='us-1']")  # none on offer
    assert "1 cordoned" in await page.inner_text("#fleet-cards")

    api_calls = [r for r in requests if "/v1/" in r.url]
    assert api_calls, "the pages made no API call"
    missing = [
        r.url for r in api_calls if r.headers.get("authorization") != f"Bearer {fed.admin_token}"
    ]
    assert not missing, f"API calls without the token: {missing[:3]}"


async def test_a_refused_call_says_so_and_the_page_keeps_going(
    live_hub: LiveHub, browser_context: Any, screenshots: Path
) -> None:
    fed = live_hub.fed
    await live_hub.start()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    page = await browser_context.new_page()
    await page.goto(live_hub.url + "/jobs")
    await log_in(page, fed.admin_token)
    await page.fill("#submit-form [name=team]", "vision")
    await page.fill("#submit-form [name=gpus_per_node]", "65")
    await page.evaluate("document.querySelector('#submit-form').noValidate = true")
    await page.click("#submit-form button[type=submit]")
    await page.wait_for_selector("#submit-result.error")
    assert "gpus_per_node" in await page.inner_text("#submit-result")
    await page.wait_for_selector("#updated:not(:has-text('never'))")
    await shoot(page, screenshots, "jobs-refused")


async def test_a_double_clicked_submit_makes_one_job(
    live_hub: LiveHub, browser_context: Any
) -> None:
    fed = live_hub.fed
    await live_hub.start()
    page = await browser_context.new_page()
    await page.goto(live_hub.url + "/jobs")
    await log_in(page, fed.admin_token)
    await page.fill("#submit-form [name=name]", "twice")
    await page.fill("#submit-form [name=team]", "vision")
    await page.fill("#submit-form [name=command]", "sleep 300")
    await page.dblclick("#submit-form button[type=submit]")
    await page.wait_for_selector("#submit-result:has-text('Submitted')")
    assert fed.hub is not None
    hub = fed.hub

    async def named(name: str) -> list[str]:
        return [w.id for w in await hub.find_workloads(team="vision") if w.spec.name == name]

    # Both clicks reached the hub (the audit log has each), and made one job.
    job = (await page.inner_text("#submit-result")).split()[-1]
    assert fed.api is not None
    api = fed.api

    async def audited() -> list[str]:
        entries = (await api.get("/v1/audit", params={"action": "submit"})).json()
        return [e["detail"] for e in entries if e["target"] == job]

    async def both() -> bool:
        return len(await audited()) == 2

    await until(both, what="an audit entry for each click, both naming the one job")
    assert sum("sent again under its Idempotency-Key" in d for d in await audited()) == 1
    assert await named("twice") == [job]
    # The next job is another: a new key once the form changed.
    await page.fill("#submit-form [name=name]", "again")
    await page.click("#submit-form button[type=submit]")
    await page.wait_for_selector("#submit-result:has-text('Submitted')")
    await until(lambda: named("again"))
    assert len(await named("twice")) == 1


async def log_in(page: Any, token: str) -> None:
    """Enter an API token in the console's token box, as a person would."""
    await page.fill("#token", token)
    await page.click("#token-form button")
    await page.wait_for_selector("#token-state:has-text('token set')")


async def rent_an_instance(live: LiveHub) -> None:
    """What burst publishes when it rents an instance: requested, then its spoke joined."""
    hub = live.fed.hub
    assert hub is not None
    now = time.time()
    for i, state in enumerate((InstanceState.REQUESTED, InstanceState.RUNNING)):
        await publish_instance(hub.bus, "burst-test-1", state, now - 10 + 5 * i)
    await until(lambda: "burst-test-1" in hub.bills and hub.bills["burst-test-1"].running_at)


async def shoot(page: Any, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
