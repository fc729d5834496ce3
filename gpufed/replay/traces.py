"""Job traces: Philly (Pollux's philly.csv), Alibaba PAI openb pods, and a generic CSV.

Every loader returns `Job`s sorted by submit time (then file line), submit times in seconds from
the first submission. Jobs wider than one node become gangs (`gang_shape`). Input is validated
row by row; a bad row raises `TraceError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

#: GPUs per node assumed when splitting wide jobs into gangs (Philly's big machines had 8).
NODE_GPUS = 8
DEFAULT_CLASS = "training"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_GPU_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_GPUS_PER_NODE = 16
MAX_NODES = 128


# submit time, file line, duration, team, whole GPUs, fraction, GPU models, priority class
_Row = tuple[float, int, float, str, int, float | None, tuple[str, ...], str]


class TraceError(ValueError):
    """The trace cannot be read; the message names the file, line and column at fault."""


@dataclass(frozen=True, slots=True)
class Job:
    """One job of a trace: `nodes` x `gpus_per_node` GPUs (or a `fraction` of one) for
    `duration` seconds of work, submitted `submit` seconds after the trace starts."""

    id: str
    submit: float
    duration: float
    team: str
    nodes: int = 1
    gpus_per_node: int = 1
    fraction: float | None = None
    gpu_models: tuple[str, ...] = ()
    priority: str = DEFAULT_CLASS

    @property
    def gpus(self) -> float:
        """GPUs the job holds while it runs (a fraction counts as its share)."""
        if self.fraction is not None:
            return self.fraction
        return float(self.nodes * self.gpus_per_node)


def gang_shape(num_gpus: int, node_gpus: int = NODE_GPUS) -> tuple[int, int]:
    """(nodes, GPUs per node) for a job asking for `num_gpus` whole GPUs.

    Up to a node's worth runs on one node. Wider jobs take the fewest nodes that hold them,
    spread evenly: 16 -> 2x8, 12 -> 2x6, 24 -> 3x8; when the GPUs do not split evenly each node
    gets the rounded-up share (20 -> 3x7, one GPU more than asked).
    """
    if num_gpus <= node_gpus:
        return 1, num_gpus
    nodes = math.ceil(num_gpus / node_gpus)
    return nodes, math.ceil(num_gpus / nodes)


def load_trace(
    path: Path, fmt: str, *, node_gpus: int = NODE_GPUS, limit: int | None = None
) -> list[Job]:
    """Read a trace in format `philly`, `alibaba` or `csv`; `limit` keeps the first N jobs."""
    loaders = {"philly": load_philly, "alibaba": load_alibaba, "csv": load_csv}
    if fmt not in loaders:
        raise TraceError(f"unknown trace format {fmt!r}; use one of {', '.join(loaders)}")
    jobs = loaders[fmt](path, node_gpus=node_gpus)
    return jobs if limit is None else jobs[:limit]


def load_philly(path: Path, *, node_gpus: int = NODE_GPUS) -> list[Job]:
    """Pollux's philly.csv: `timestamp,duration,num_gpus,gpu_time,cluster`, rows unsorted.

    The virtual cluster (`cluster`) is the team; every job is of class `training`.
    """
    rows: list[_Row] = []
    for line, row in _rows(path, ("timestamp", "duration", "num_gpus", "cluster")):
        at = _where(path, line)
        try:
            # Local time of an unknown zone: read as UTC so no DST shift depends on this host.
            stamp = datetime.fromisoformat(row["timestamp"].strip())
            submit = stamp.replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise TraceError(
                f"{at}, column timestamp: {row['timestamp']!r} is not YYYY-MM-DD HH:MM:SS"
            ) from None
        duration = _positive(row, "duration", at)
        gpus = _count(row, "num_gpus", at)
        team = _team(row, "cluster", at)
        rows.append((submit, line, duration, team, gpus, None, (), DEFAULT_CLASS))
    return _jobs(rows, node_gpus, path)


def load_csv(path: Path, *, node_gpus: int = NODE_GPUS) -> list[Job]:
    """Generic CSV: `submit_time,duration,num_gpus,team` (seconds), optional `gpu_model`
    (one, or several separated by `|`, most preferred first) and `priority` (a class name).

    `num_gpus` is a whole number, or a share of one GPU between 0 and 1 (e.g. 0.5).
    """
    rows: list[_Row] = []
    for line, row in _rows(path, ("submit_time", "duration", "num_gpus", "team")):
        at = _where(path, line)
        submit = _number(row, "submit_time", at)
        if submit < 0:
            raise TraceError(f"{at}, column submit_time: must not be negative, got {submit:g}")
        duration = _positive(row, "duration", at)
        gpus = _number(row, "num_gpus", at)
        whole, fraction = 0, None
        if 0 < gpus < 1:
            fraction = gpus
        elif gpus >= 1 and gpus == int(gpus):
            whole = int(gpus)
        else:
            raise TraceError(
                f"{at}, column num_gpus: {row['num_gpus']!r} must be a whole number of GPUs "
                "or a share of one GPU between 0 and 1"
            )
        team = _team(row, "team", at)
        models = _models(row.get("gpu_model") or "", at)
        priority = (row.get("priority") or "").strip() or DEFAULT_CLASS
        if not _DNS_LABEL.match(priority):
            raise TraceError(f"{at}, column priority: {priority!r} is not a class name")
        rows.append((submit, line, duration, team, whole, fraction, models, priority))
    return _jobs(rows, node_gpus, path)


def load_alibaba(path: Path, *, node_gpus: int = NODE_GPUS) -> list[Job]:
    """Alibaba openb pods as a time series (a sample of shapes, not a load series).

    A GPU pod runs from `scheduled_time` (or `creation_time`) to `deletion_time`; CPU-only pods
    and pods never deleted are skipped. The QoS class (LS, BE, ...) is the team; `gpu_milli`
    below 1000 on a one-GPU pod is a fractional GPU.
    """
    rows: list[_Row] = []
    for line, pod in alibaba_pods(path):
        start = pod.scheduled if pod.scheduled > 0 else pod.created
        if pod.deleted <= start:
            continue
        rows.append(
            (
                pod.created,
                line,
                pod.deleted - start,
                pod.qos.lower(),
                pod.num_gpu,
                pod.fraction,
                pod.models,
                DEFAULT_CLASS,
            )
        )
    return _jobs(rows, node_gpus, path)


@dataclass(frozen=True, slots=True)
class Pod:
    """One GPU pod of the openb trace (times in seconds, relative)."""

    name: str
    num_gpu: int
    fraction: float | None
    models: tuple[str, ...]
    qos: str
    created: float
    scheduled: float
    deleted: float


def alibaba_pods(path: Path) -> Iterator[tuple[int, Pod]]:
    """The GPU pods of openb_pod_list_*.csv with their file lines (CPU-only pods left out)."""
    needed = ("name", "num_gpu", "gpu_milli", "qos", "creation_time")
    for line, row in _rows(path, needed):
        at = _where(path, line)
        num_gpu = _count(row, "num_gpu", at, zero=True)
        if num_gpu == 0:
            continue
        milli = _number(row, "gpu_milli", at)
        fraction = milli / 1000.0 if num_gpu == 1 and 0 < milli < 1000 else None
        qos = (row["qos"] or "").strip() or "none"
        if not _DNS_LABEL.match(qos.lower()):
            raise TraceError(f"{at}, column qos: {qos!r} is not a usable team name")
        yield (
            line,
            Pod(
                name=row["name"],
                num_gpu=num_gpu,
                fraction=fraction,
                models=_models(row.get("gpu_spec") or "", at),
                qos=qos,
                created=_number(row, "creation_time", at),
                scheduled=_optional(row, "scheduled_time", at),
                deleted=_optional(row, "deletion_time", at),
            ),
        )


# --- helpers, in call order ---


def _rows(path: Path, needed: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8-sig")  # a BOM: saved by Excel
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = [name.strip() for name in reader.fieldnames or ()]
            missing = [name for name in needed if name not in header]
            if missing:
                found = ",".join(header) or "nothing"
                raise TraceError(
                    f"{path} line 1: missing column(s) {', '.join(missing)} "
                    f"(header is {found}; expected {','.join(needed)})"
                )
            reader.fieldnames = header
            for row in reader:
                line = reader.line_num
                if None in row or any(row.get(name) is None for name in needed):
                    raise TraceError(f"{_where(path, line)}: expected {len(header)} columns")
                yield line, row
        except UnicodeDecodeError:  # Latin-1 and the like: say where, and what to do
            raise TraceError(_not_utf8(path)) from None


def _not_utf8(path: Path) -> str:
    """Where `path` stops being UTF-8 (the reader decodes in blocks: found again, whole)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return (
            f"{_where(path, line)}: not UTF-8 text (byte {data[exc.start]:#04x}); save it as UTF-8"
        )
    return f"{path}: not UTF-8 text; save it as UTF-8"


def _where(path: Path, line: int) -> str:
    return f"{path} line {line}"


def _number(row: dict[str, str], column: str, at: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{at}, column {column}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"{at}, column {column}: {text!r} is not a finite number")
    return value


def _optional(row: dict[str, str], column: str, at: str) -> float:
    return _number(row, column, at) if (row.get(column) or "").strip() else 0.0


def _positive(row: dict[str, str], column: str, at: str) -> float:
    value = _number(row, column, at)
    if value <= 0:
        raise TraceError(f"{at}, column {column}: must be greater than 0, got {value:g}")
    return value


def _count(row: dict[str, str], column: str, at: str, *, zero: bool = False) -> int:
    value = _number(row, column, at)
    if value != int(value) or value < (0 if zero else 1):
        least = "0" if zero else "1"
        raise TraceError(
            f"{at}, column {column}: {row[column]!r} must be a whole number >= {least}"
        )
    return int(value)


def _team(row: dict[str, str], column: str, at: str) -> str:
    team = (row.get(column) or "").strip()
    if not _DNS_LABEL.match(team):
        raise TraceError(
            f"{at}, column {column}: {team!r} is not a team name "
            "(lower-case letters, digits and '-', at most 63)"
        )
    return team


def _models(text: str, at: str) -> tuple[str, ...]:
    models = tuple(m.strip() for m in text.split("|") if m.strip())
    for model in models:
        if not _GPU_MODEL.match(model):
            raise TraceError(f"{at}, column gpu_model: {model!r} is not a GPU model name")
    return models


def _shape(gpus: int, node_gpus: int, path: Path) -> tuple[int, int]:
    nodes, per_node = gang_shape(gpus, node_gpus)
    if nodes > MAX_NODES or per_node > MAX_GPUS_PER_NODE:
        raise TraceError(f"{path}: a job asks for {gpus} GPUs, more than a workload may hold")
    return nodes, per_node


def _jobs(rows: list[_Row], node_gpus: int, path: Path) -> list[Job]:
    """Number the rows' jobs in submit order (then file line), times from the first submit."""
    rows.sort(key=lambda r: (r[0], r[1]))
    if not rows:
        return []
    start = rows[0][0]
    width = max(6, len(str(len(rows))))
    jobs = []
    for i, (submit, _, duration, team, whole, fraction, models, priority) in enumerate(rows):
        nodes, per_node = (1, 1) if fraction is not None else _shape(whole, node_gpus, path)
        jobs.append(
            Job(
                f"j{i:0{width}d}",
                submit - start,
                duration,
                team,
                nodes,
                per_node,
                fraction,
                models,
                priority,
            )
        )
    return jobs
