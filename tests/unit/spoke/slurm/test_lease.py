"""The deadline a fenced Slurm job reads: the spoke's own fence rule, in whole seconds."""

from __future__ import annotations

import json
from pathlib import Path

from schemas import LeaseAck
from spoke.fencing import Fence, Guard, fence_file
from spoke.runtime.slurm.lease import DEADLINE_FILE, LeaseFile


def test_the_deadline_is_heard_at_plus_fence_after_and_moves_with_each_ack(tmp_path: Path) -> None:
    guard = Guard(fence_file(tmp_path), heartbeat_s=1.0, stop_grace_s=2.0)
    lease = LeaseFile(guard, tmp_path / "runs")
    lease.refresh()
    assert not (tmp_path / "runs" / DEADLINE_FILE).exists()  # never heard: nothing to fence

    fence = Fence(guard.fence_path, heartbeat_s=1.0, stop_grace_s=2.0)
    fence.sent(1, 1000.7)
    fence.acked(LeaseAck(spoke_id="s", incarnation="i", seq=1, term=1, lost_after_s=30.0))
    fence.save()
    job = lease.job(tmp_path / "runs" / "w-e0.fenced")
    # lost_after less the grace and three heartbeats, from the send time, rounded down
    assert job.deadline_path.read_text() == "1025\n" == f"{int(1000.7 + 30 - 2 - 3)}\n"
    assert job.grace_s == 2.0
    assert fence.deadline() == 1000.7 + 25

    fence.sent(2, 1003.2)
    fence.acked(LeaseAck(spoke_id="s", incarnation="i", seq=2, term=1, lost_after_s=30.0))
    fence.save()
    lease.refresh()
    assert job.deadline_path.read_text() == "1028\n"
    assert json.loads(guard.fence_path.read_text())["heard_at"] == 1003.2
