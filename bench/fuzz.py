"""Fuzz a real hub (REST API from its OpenAPI document, every NATS subject it handles).

    .venv/bin/python bench/fuzz.py [--api-cases 2000] [--nats-cases 2000] [--seed N]

Prints one JSON object: {"api_cases", "nats_cases", "server_errors", "crashes", "hangs"}, and
the first findings on standard error. Exit status 1 when anything was found.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

# The fuzzer lives with the tests (tests/support/fuzzing.py): the repository root must be
# importable when this runs as `python bench/fuzz.py`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufed import logs
from tests.support.fuzzing import fuzz_hub


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-cases", type=int, default=2000)
    parser.add_argument("--nats-cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="0: a random run")
    args = parser.parse_args()
    logs.configure(level="warning")  # standard output carries the JSON only
    with tempfile.TemporaryDirectory(prefix="gpufed-fuzz-") as tmp:
        found = fuzz_hub(Path(tmp), args.api_cases, args.nats_cases, args.seed)
    print(json.dumps(found.summary()))
    for example in found.examples:
        print(example, file=sys.stderr)
    bad = found.server_errors + found.crashes + found.hangs
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
