"""Reading a YAML (or JSON) document the user names on the command line: a workload spec, a
service spec, a policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_mapping(path: Path, empty_ok: bool = True) -> dict[str, Any]:
    """The mapping in `path` (an empty file reads as `{}` when `empty_ok`); a ValueError that
    names the file and what is wrong with it (cannot be read, not YAML, not a mapping)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"{path}: cannot read it: {reason}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise ValueError(f"{path}: not valid YAML{at}: {problem}") from None
    if document is None:
        if empty_ok:
            return {}
        raise ValueError(f"{path}: is empty; it must hold a mapping (key: value lines)")
    if not isinstance(document, dict):
        kind = "a list" if isinstance(document, list) else f"a {type(document).__name__}"
        raise ValueError(f"{path}: must hold a mapping (key: value lines), not {kind}")
    return document
