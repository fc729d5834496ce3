"""`gpufed hub`, `gpufed spoke` and `gpufed up --help` explain every setting (README: "take
`--help` for every setting"): an operator reads them, not the source."""

from __future__ import annotations

import argparse

import pytest

from gpufed import cli


def _command(name: str) -> argparse.ArgumentParser:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


@pytest.mark.parametrize("name", ["hub", "spoke", "up"])
def test_every_option_says_what_it_is(name: str) -> None:
    unexplained = [
        a.option_strings[-1]
        for a in _command(name)._actions
        if a.option_strings and a.dest != "help" and not a.help
    ]
    assert unexplained == []
