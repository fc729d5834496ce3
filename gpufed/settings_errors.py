"""A setting refused at start, said with the flag a person typed (`--heartbeat: must be
greater than 0`), not as pydantic's dump of the settings model (`heartbeat_s  Input should be
greater than 0 [type=greater_than, ...] For further information visit https://...`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from pydantic import ValidationError

from schemas.errors import problem_sentence


def refused_settings(
    exc: ValidationError, parser: argparse.ArgumentParser, renamed: Mapping[str, str]
) -> str:
    """Each problem as '--flag: sentence', joined. `renamed`: a setting's name -> the dest of
    its flag where they differ beyond a `_s` suffix (`heartbeat_s` is `--heartbeat`)."""
    flags = {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        dest = renamed.get(field, field)
        flag = flags.get(dest) or flags.get(dest.removesuffix("_s"))
        parts.append(f"{flag or field}: {problem_sentence(error)}")
    return "; ".join(parts)
