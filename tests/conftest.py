"""Shared test set-up: structured logs to stderr, quiet unless a test fails."""

from __future__ import annotations

import sys

from gpufed import logs

logs.configure(sys.stderr, json=False, level="warning")
