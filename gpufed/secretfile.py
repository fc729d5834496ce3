"""Reading a value handed over as a file (a mounted Secret's key: a URL, a store URL), and the
folders that hold secrets at rest."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_secret_file(path: Path, flag: str) -> str:
    """The stripped text of `path`; a ValueError naming `flag` and the file (never its text)
    when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"{flag}: {exc.strerror}: {path}") from None


def private_dir(path: Path) -> Path:
    """Make `path` (and its parents) and leave it readable by its owner only (0700).

    For the hub's data dir, whose SQLite store holds workloads' specs, secret env values
    included. A folder that exists with a wider mode (made by an older gpufed) is narrowed if
    this process owns it; one it does not own (a volume mounted for it) is left to whoever
    mounted it.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = path.stat()
    if found.st_uid == os.geteuid() and stat.S_IMODE(found.st_mode) & 0o077:
        path.chmod(0o700)
    return path
