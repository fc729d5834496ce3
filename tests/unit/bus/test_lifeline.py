"""Which lifeline a process was handed (`bus.lifeline.passed`): only a pipe it holds."""

from __future__ import annotations

import os
from pathlib import Path

from bus import lifeline


def test_a_pipe_named_by_the_variable_is_the_lifeline(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    other = os.open(tmp_path / "log", os.O_CREAT | os.O_WRONLY)
    try:
        assert lifeline.passed({lifeline.ENV: str(read_end)}) == read_end
        # A variable left in a shell naming some other open file: no lifeline, nothing read.
        assert lifeline.passed({lifeline.ENV: str(other)}) is None
        assert lifeline.passed({lifeline.ENV: "not a number"}) is None
        assert lifeline.passed({}) is None
        os.close(write_end)
        write_end = -1
        assert lifeline.passed({lifeline.ENV: str(write_end)}) is None  # not open
    finally:
        for fd in (read_end, write_end, other):
            if fd >= 0:
                os.close(fd)
