"""The shared exit-code file's generations: what a restarted spoke can read, and what goes."""

from __future__ import annotations

from pathlib import Path

import pytest

import spoke.runtime.exitlog as exitlog_module
from spoke.runtime.exitlog import ExitLog


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_generation_rotates_and_goes_once_no_open_run_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exitlog_module, "ROTATE_AFTER", 2)
    log = ExitLog(tmp_path)
    first = [log.begin(), log.begin()]
    third = log.begin()  # past ROTATE_AFTER: a new file
    assert first == [0, 0] and third == 1
    assert _files(tmp_path) == ["exits-0.txt", "exits-1.txt"]
    log.end(0)
    assert _files(tmp_path) == ["exits-0.txt", "exits-1.txt"]  # one of its runs still open
    log.end(0)
    assert _files(tmp_path) == ["exits-1.txt"]
    log.end(1)
    assert _files(tmp_path) == ["exits-1.txt"]  # the current one stays for the next start


def test_codes_are_read_as_wrappers_append_them_and_a_half_written_line_waits(
    tmp_path: Path,
) -> None:
    log = ExitLog(tmp_path)
    generation = log.begin()
    path = Path(log.path(generation))
    assert log.code(generation, "w1-e1-r0.exit") is None
    with open(path, "a") as f:
        f.write("w1-e1-r0.exit 3\nw2-e1-r0.exit 0\nw3-e2-r1.exit 1")  # w3's line unfinished
    assert log.code(generation, "w1-e1-r0.exit") == 3
    assert log.code(generation, "w3-e2-r1.exit") is None
    with open(path, "a") as f:
        f.write("37\ngarbage\n")
    assert log.code(generation, "w3-e2-r1.exit") == 137
    assert log.code(generation, "w2-e1-r0.exit") == 0
    assert log.code(7, "w1-e1-r0.exit") is None  # a generation whose file is gone


def test_a_restarted_spoke_keeps_the_generations_its_adopted_runs_name(tmp_path: Path) -> None:
    before = ExitLog(tmp_path)
    named, _ = before.begin(), before.begin()
    (tmp_path / "exits-5.txt").write_text("")  # a previous life's, named by no open run
    (tmp_path / "runs.jsonl").write_text("")

    after = ExitLog(tmp_path)  # the spoke restarted: one open run names generation 0
    after.adopted(named)
    after.prune()
    assert _files(tmp_path) == ["exits-0.txt", "runs.jsonl"]
    assert after.begin() == 1  # a file of its own, not one an earlier life appended to
    after.end(named)
    assert _files(tmp_path) == ["exits-1.txt", "runs.jsonl"]
