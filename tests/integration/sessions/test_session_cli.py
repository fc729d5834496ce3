"""`gpufed session open|list|close` as a user runs them, against a served hub."""

from __future__ import annotations

import sys

import httpx

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.sessions.helpers import SERVER, STOP_ON_EXIT, gpufed


async def test_open_prints_a_url_that_answers_then_list_and_close(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    async with fed.serve() as api:
        code, out, err = await gpufed(
            fed,
            api,
            "session", "open", "--team", "vision", "--gpus", "0.5", "--name", "nb",
            # A server that takes its time to listen, as Jupyter does: the spoke's relay
            # accepts connections from the start, the server only later.
            "--", "sh", "-c", 'sleep 1.5; exec "$0" -c "$1"', sys.executable, SERVER,
        )  # fmt: skip
        assert code == 0, err
        url = out.strip().splitlines()[-1]
        assert url.startswith("http://127.0.0.1:")
        # Answers the moment `open` returns: it waited for the server, not only the relay.
        async with httpx.AsyncClient() as client:
            answer = await client.get(url, timeout=5)
        assert answer.status_code == 200
        wid = answer.text.removeprefix("hello from ")

        code, out, err = await gpufed(fed, api, "session", "list")
        assert code == 0, err
        [row] = [line for line in out.splitlines() if line.startswith(wid)]
        assert "running" in row and url in row and "nb" in row

        code, out, err = await gpufed(fed, api, "session", "close", wid)
        assert code == 0, err
        await fed.wait_phase(wid, {Phase.CANCELLED})
        code, out, _ = await gpufed(fed, api, "session", "list")
        assert wid not in out


async def test_open_says_why_when_the_session_fails(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    async with fed.serve() as api:
        code, out, err = await gpufed(
            fed, api, "session", "open", "--team", "vision", "--", "sh", "-c", "exit 3"
        )
    assert code == 1
    assert "ended failed" in err and "exit code 3" in err
    assert out == ""


async def test_open_that_times_out_says_the_session_still_waits_and_why(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    async with fed.serve() as api:
        code, out, err = await gpufed(
            fed, api, "session", "open", "--team", "vision", "--gpu-model", "B200",
            "--timeout", "1", "--", sys.executable, "-c", SERVER,
        )  # fmt: skip
    assert code == 1 and out == ""
    last = err.strip().splitlines()[-1]
    # It never ran: the last word says it is queued and why, not that it "keeps running".
    assert "still queued: no schedulable node has B200 GPUs" in last, err
    assert "gpufed session close w" in last


async def test_close_refuses_a_workload_that_is_not_a_session(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    job = await fed.submit(name="train", team="vision", command=["sleep", "60"])
    await fed.wait_phase(job, {Phase.RUNNING})
    async with fed.serve() as api:
        code, out, err = await gpufed(fed, api, "session", "close", job)
    assert code == 1 and out == ""
    assert f"{job} is a job, not a session (`gpufed cancel {job}` stops it)" in err
    record = await fed.workload(job)
    assert record["phase"] == "running" and not record["cancel_requested"]


async def test_a_refused_session_names_the_flag_the_user_typed(fed: InProcessFederation) -> None:
    await fed.start_hub()
    async with fed.serve() as api:
        code, out, err = await gpufed(
            fed, api, "session", "open", "--team", "vision", "--gpus", "1.5", "--", "true"
        )
    assert (code, out) == (1, "")
    assert "gpus_per_node: " in err and err.rstrip().endswith("(--gpus) [invalid_workload]"), err
