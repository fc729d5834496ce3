"""A bounded property-based fuzz of a real hub's REST API and NATS subjects (bench/fuzz.py
runs thousands of cases)."""

from __future__ import annotations

from pathlib import Path

from tests.support.fuzzing import fuzz_hub


def test_fuzzed_api_and_nats_input_never_breaks_the_hub(tmp_path: Path) -> None:
    found = fuzz_hub(tmp_path / "fed", api_cases=300, nats_cases=300)
    assert found.api_cases == 300 and found.nats_cases == 300
    assert (found.server_errors, found.crashes, found.hangs) == (0, 0, 0), found.examples
