"""The logs `gpufed up` keeps (`.gpufed/logs/<piece>.log`, NATS's beside them): each at most
MAX_LOG_BYTES, with the part before in `<piece>.log.1`, so a federation left running for
weeks does not fill its disk.

Each piece writes to its log through a descriptor opened for appending, which it keeps: the
log is copied to `.1` and then emptied in place (`copytruncate`, as logrotate does it for
such writers), and the piece's next line lands at the start of the emptied file. A line
written between the copy and the emptying is lost: a few bytes once every 64 MiB.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

#: A log's size past which it is rotated.
MAX_LOG_BYTES = 64 * 1024 * 1024


def rotate(path: Path, max_bytes: int = MAX_LOG_BYTES) -> bool:
    """Copy `path` to `<path>.1` and empty it when it is over `max_bytes`; whether it did."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    shutil.copyfile(path, path.with_name(path.name + ".1"))
    os.truncate(path, 0)
    return True


def rotate_all(paths: Iterable[Path], max_bytes: int = MAX_LOG_BYTES) -> list[Path]:
    """`rotate` each of `paths`; those rotated."""
    return [path for path in paths if rotate(path, max_bytes)]
