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

# Run as `python bench/fuzz.py`, the bench folder leads sys.path and bench/burst.py would shadow
# the burst package; the repository root must be importable for tests.fuzzing.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from gpufed import logs  # noqa: E402
from tests.fuzzing import fuzz_hub  # noqa: E402


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
