"""`gpufed replay --from-hub`: a real hub's finished workloads replayed under two policies."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.test_cordon import drained

pytestmark = pytest.mark.integration

IN_FORCE = {
    "version": 1,
    "teams": [
        {"name": "vision", "quotas": {"H100": {"guaranteed": 2, "limit": 2}}},
        {"name": "nlp", "quotas": {"H100": {"guaranteed": 2, "limit": 2}}},
    ],
}
PROPOSED = """
version: 1
teams:
  - {name: vision, quotas: {H100: {guaranteed: 2}}}
  - {name: nlp, quotas: {H100: {guaranteed: 2}}}
"""


async def test_replays_the_hubs_workloads_under_both_policies(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    await fed.start_hub()
    assert fed.api is not None
    assert (await fed.api.put("/v1/policy", json=IN_FORCE)).status_code == 200
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    ids = []
    for i in range(6):  # vision submits everything: the policy in force caps it at 2 GPUs
        spec = {
            "name": f"j{i}",
            "team": "vision",
            "gpus_per_node": 1,
            "gpu_model": "H100",
            "command": ["sleep", "1"],
        }
        ids.append(await fed.submit(**spec))
    ended = [await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=30) for wid in ids]
    assert len({r["started_at"] for r in ended}) > 1
    proposed = tmp_path / "new.yaml"
    proposed.write_text(PROPOSED, encoding="utf-8")
    out = tmp_path / "out"
    async with fed.serve() as url:
        code, stdout, stderr = await replay(
            url, "--since", "1h", "--policy", str(proposed), "--no-plots", "--out", str(out),
            token=fed.admin_token,
        )  # fmt: skip
        first, _, _ = await replay(
            url, "--since", "1h", "--policy", str(proposed), "--no-plots", "--out",
            str(tmp_path / "two"), "--limit-jobs", "2", token=fed.admin_token,
        )  # fmt: skip
    assert code == 0, stderr
    assert first == 0
    two = json.loads((tmp_path / "two" / "proposed" / "report.json").read_text())
    assert two["jobs"]["total"] == 2  # --limit-jobs: the first two, as with a trace
    lines = stdout.splitlines()
    assert json.loads(lines[0]) == {"jobs": 6, "skipped": {}}
    side = json.loads(lines[1])
    # Capped at 2 GPUs, vision queues in force; under the proposal it borrows nlp's idle two.
    assert side["avg_wait_s"]["in_force"] > side["avg_wait_s"]["proposed"]
    for name in ("in-force", "proposed"):
        report = json.loads((out / name / "report.json").read_text())
        assert report["jobs"]["finished"] == 6
        assert report["fleet"]["onprem_gpus"] == 4


async def test_work_that_was_drained_is_replayed_with_every_run(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    # A workload drained off its spoke waits again, then runs to its end. While it waits the
    # replay counts it (it was skipped as never started: its record's started_at is None);
    # once it ended, it lasts both runs under `resume` (it lasted its last run alone).
    wid, waiting = await drained(fed, sleep_s=3, ran_s=2)
    assert fed.api is not None
    assert waiting["started_at"] is None and waiting["attempts"][0]["end_reason"] == "preempted"
    (tmp_path / "p.yaml").write_text(PROPOSED, encoding="utf-8")
    args = ("--policy", str(tmp_path / "p.yaml"), "--no-plots", "--cycle-s", "0.01")
    async with fed.serve() as url:
        code, stdout, stderr = await replay(
            url, *args, "--out", str(tmp_path / "waits"), token=fed.admin_token
        )
        assert code == 0, stderr
        assert json.loads(stdout.splitlines()[0]) == {"jobs": 1, "skipped": {}}
        assert (await fed.api.delete("/v1/spokes/eu-1/cordon")).status_code == 200
        ended = await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=30)
        code, _, stderr = await replay(
            url, *args, "--out", str(tmp_path / "ended"), token=fed.admin_token
        )
    assert code == 0, stderr
    first, second = ended["attempts"]
    runs = [a["ended_at"] - a["started_at"] for a in (first, second)]
    assert runs[0] >= 2.0 and runs[1] >= 3.0
    report = json.loads((tmp_path / "ended" / "in-force" / "report.json").read_text())
    assert report["jobs"]["finished"] == 1
    assert report["avg_jct_s"] == pytest.approx(sum(runs), abs=0.1)


async def test_a_hub_that_cannot_be_reached_is_a_clear_error(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    (tmp_path / "p.yaml").write_text(PROPOSED, encoding="utf-8")
    code, _, stderr = await replay(
        f"http://127.0.0.1:{port}", "--policy", str(tmp_path / "p.yaml"), "--out",
        str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 1
    assert f"cannot read the hub at http://127.0.0.1:{port}" in stderr


async def test_uses_gpufed_ups_admin_token_like_the_other_commands(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    # The README's tour: in the folder `gpufed up` ran in, with no GPUFED_TOKEN set, every
    # command sends .gpufed/admin.token; the replay must too (it used to get a 401).
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(name="j", team="vision", gpus_per_node=1, command=["true"])
    await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=30)
    (tmp_path / ".gpufed").mkdir()
    (tmp_path / ".gpufed" / "admin.token").write_text(fed.admin_token + "\n", encoding="utf-8")
    (tmp_path / "new.yaml").write_text(PROPOSED, encoding="utf-8")
    async with fed.serve() as url:  # no token given: it finds the file, as `gpufed jobs` does
        code, stdout, stderr = await replay(
            url, "--policy", "new.yaml", "--out", "out", cwd=tmp_path
        )
        assert code == 0, stderr
        assert json.loads(stdout.splitlines()[0]) == {"jobs": 1, "skipped": {}}
        # GPUFED_API as `gpufed up --hubs 2` prints it, the first hub down: the next is read.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            down = f"http://127.0.0.1:{sock.getsockname()[1]}"
        code, stdout, stderr = await replay(
            f"{down},{url}", "--policy", "new.yaml", "--out", "out2", cwd=tmp_path
        )
    assert code == 0, stderr
    assert json.loads(stdout.splitlines()[0]) == {"jobs": 1, "skipped": {}}


WINDOWED = """
version: 1
teams: [{name: vision, quotas: {H100: {limit: 1}}}]
windows:
  - {name: day, days: weekdays, start: "08:00", end: "20:00",
     teams: {vision: {quotas: {H100: {limit: 3}}}}}
"""


async def test_time_windows_apply_at_the_hours_the_work_was_submitted(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    # The hub's clock reads Monday 10:00 UTC: the day window lets vision run 3 at once. The
    # replay must see it in force there (it used to replay from 1970-01-01, a Thursday 00:00,
    # outside the window), so the policy in force beats the same policy without the window.
    monday_10 = datetime(2024, 1, 8, 10, tzinfo=UTC).timestamp()
    began = time.time()
    await fed.start_hub(clock=lambda: monday_10 + time.time() - began)
    assert fed.api is not None
    windowed = yaml.safe_load(WINDOWED)
    assert (await fed.api.put("/v1/policy", json=windowed)).status_code == 200
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    spec = {"team": "vision", "gpus_per_node": 1, "gpu_model": "H100", "command": ["sleep", "1"]}
    ids = [await fed.submit(name=f"j{i}", **spec) for i in range(3)]
    for wid in ids:
        await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=30)
    del windowed["windows"]
    (tmp_path / "no-window.yaml").write_text(yaml.safe_dump(windowed), encoding="utf-8")
    out = tmp_path / "out"
    async with fed.serve() as url:
        code, stdout, stderr = await replay(
            url, "--since", "100000d", "--policy", str(tmp_path / "no-window.yaml"),
            "--cycle-s", "0.01", "--out", str(out), token=fed.admin_token,
        )  # fmt: skip
    assert code == 0, stderr
    wait = json.loads(stdout.splitlines()[1])["avg_wait_s"]
    assert wait["in_force"] < wait["proposed"]
    report = json.loads((out / "in-force" / "report.json").read_text())
    assert report["trace"]["start"].startswith("2024-01-08T10:00")


async def replay(
    url: str, *argv: str, token: str | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    """`gpufed replay --from-hub URL ... --quiet` as a user runs it: exit code, out, err. With
    no `token`, none in the environment either (the command looks for one as the CLI does)."""
    env = {k: v for k, v in os.environ.items() if "TOKEN" not in k}
    if token is not None:
        env["GPUFED_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpufed.replay", "--from-hub", url, "--quiet", *argv,
        cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(), stderr.decode()
