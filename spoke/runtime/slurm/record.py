"""The Slurm runtime's own small record: which jobs it submitted and which ends it reported.

One JSON line per submitted job and per reported end, in `<run dir>/slurm-jobs.jsonl`. Slurm
itself is the source of truth for what runs (jobs carry their identity in their comment); the
record adds what Slurm forgets: a job that ended long ago (past MinJobAge) and whether its end
was already reported, so a restarted spoke neither loses nor repeats an end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Submitted:
    """A job the runtime submitted and has not reported ended."""

    workload_id: str
    epoch: int
    job_id: str


class JobRecord:
    """Append-only record of submitted jobs and reported ends (one process at a time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    def submitted(self, entry: Submitted) -> None:
        self._append({"t": "job", "w": entry.workload_id, "e": entry.epoch, "j": entry.job_id})

    def ended(self, workload_id: str, epoch: int) -> None:
        self._append({"t": "end", "w": workload_id, "e": epoch})

    def replay(self) -> list[Submitted]:
        """Jobs submitted and not reported ended; rewrites the file to just those."""
        open_jobs: dict[tuple[str, int], Submitted] = {}
        if self.path.exists():
            for number, line in enumerate(self.path.read_text().splitlines(), 1):
                try:
                    rec = json.loads(line)
                    key = (str(rec["w"]), int(rec["e"]))
                    if rec["t"] == "job":
                        open_jobs[key] = Submitted(key[0], key[1], str(rec["j"]))
                    else:
                        open_jobs.pop(key, None)
                except (ValueError, KeyError, TypeError) as exc:  # a torn last line
                    log.warning("slurm_record_line_skipped", line=number, error=str(exc))
            self.close()
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(
                "".join(
                    json.dumps({"t": "job", "w": s.workload_id, "e": s.epoch, "j": s.job_id}) + "\n"
                    for s in open_jobs.values()
                )
            )
            os.replace(tmp, self.path)
        return list(open_jobs.values())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
