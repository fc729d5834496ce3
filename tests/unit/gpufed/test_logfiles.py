"""`gpufed up`'s logs stay bounded while the pieces go on writing to them."""

from __future__ import annotations

import os
from pathlib import Path

from gpufed.logfiles import MAX_LOG_BYTES, rotate_all
from gpufed.up import Federation


def test_a_log_past_its_bound_is_kept_as_dot_one_and_the_writer_goes_on_from_the_start(
    tmp_path: Path,
) -> None:
    log, quiet = tmp_path / "hub.log", tmp_path / "eu-1.log"
    quiet.write_bytes(b"small\n")
    # A piece's own descriptor, opened for appending and kept, as `gpufed up` hands it over.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"old line\n" * 200)  # 1,800 bytes
        assert rotate_all([log, quiet, tmp_path / "gone.log"], max_bytes=1000) == [log]
        os.write(fd, b"new line\n")
    finally:
        os.close(fd)
    assert (tmp_path / "hub.log.1").read_bytes() == b"old line\n" * 200
    assert log.read_bytes() == b"new line\n"  # at the start: no hole of 1,800 zero bytes
    assert quiet.read_bytes() == b"small\n" and not (tmp_path / "eu-1.log.1").exists()
    assert rotate_all([log], max_bytes=1000) == []  # nothing more to do


def test_gpufed_up_rotates_a_piece_s_log_once_it_is_past_the_bound(tmp_path: Path) -> None:
    fed = Federation(tmp_path / "fed", api_port=0, fleet=())
    fed.log_dir.mkdir(parents=True)
    grown = fed.log_dir / "hub.log"
    grown.touch()
    os.truncate(grown, MAX_LOG_BYTES + 1)  # sparse: past the bound without writing 64 MiB
    assert fed.supervise(now=100.0) == []  # nothing to start again; the log rotated
    assert grown.stat().st_size == 0
    assert (fed.log_dir / "hub.log.1").stat().st_size == MAX_LOG_BYTES + 1
