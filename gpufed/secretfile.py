"""Reading a value handed over as a file (a mounted Secret's key: a URL, a store URL)."""

from __future__ import annotations

from pathlib import Path


def read_secret_file(path: Path, flag: str) -> str:
    """The stripped text of `path`; a ValueError naming `flag` and the file (never its text)
    when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"{flag}: {exc.strerror}: {path}") from None
