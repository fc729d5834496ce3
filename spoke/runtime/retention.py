"""How long a spoke keeps what an ended workload left on its disk (its logs, its workspace, its
load file): the rule, without the files. Pure: every time is given.

A spoke that runs short jobs all day made a log and a folder for each and never removed one:
at 400 starts a second, 1.4 million an hour, until the disk or its inodes ran out, and a read
of an ended workload's log listed a folder of millions. A workload's files are kept for
`Keep.seconds` after it last ended here, and no more than `Keep.count` ended workloads' files
are kept (the oldest go first), as Kubernetes keeps terminated pods up to a threshold.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from spoke.settings import KEEP_ENDED, KEEP_ENDED_S


@dataclass(frozen=True)
class Keep:
    seconds: float = KEEP_ENDED_S
    count: int = KEEP_ENDED

    def describe(self) -> str:
        """As a person reads it: "for 7 days, the last 10000 at most"."""
        units = (("day", 86400), ("hour", 3600))
        unit, size = next((u for u in units if self.seconds >= u[1]), ("second", 1))
        n = self.seconds / size
        return f"for {n:g} {unit}{'' if n == 1 else 's'}, the last {self.count} at most"


@dataclass(frozen=True)
class Leftover:
    """An ended workload whose files are due to go: its logs are one per epoch it ran here."""

    workload_id: str
    epochs: frozenset[int]


class EndedRuns:
    """The workloads that ended here and whose files are kept, in the order they ended.

    A workload started again here (requeued to the same spoke) is live: its files stay, and
    the epochs it ran before are remembered for when it ends again."""

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self._ended: OrderedDict[str, tuple[float, set[int]]] = OrderedDict()
        # The workloads started here and not ended since: the epochs each ended before.
        self._live: dict[str, set[int]] = {}

    def __len__(self) -> int:
        return len(self._ended)

    def started(self, workload_id: str) -> None:
        entry = self._ended.pop(workload_id, None)
        self._live[workload_id] = entry[1] if entry is not None else set()

    def ended(self, workload_id: str, epoch: int | None, at: float) -> None:
        """`workload_id` ended at `at` (its epoch None: files of no known epoch, as a workspace
        found without a log). Calls come in the order of `at`, or nearly."""
        epochs = self._live.pop(workload_id, None) or set()
        entry = self._ended.pop(workload_id, None)
        if entry is not None:
            epochs |= entry[1]
            at = max(at, entry[0])
        if epoch is not None:
            epochs.add(epoch)
        self._ended[workload_id] = (at, epochs)

    def found(self, leftovers: list[tuple[float, str, int | None]]) -> None:
        """What a previous spoke process left, found on disk as (time, workload, epoch) in
        the order of time: older than anything that ended since, so kept before it."""
        older: OrderedDict[str, tuple[float, set[int]]] = OrderedDict()
        for at, workload_id, epoch in leftovers:
            epochs = self._live.get(workload_id)
            if epochs is None:
                entry = self._ended.get(workload_id) or older.pop(workload_id, None)
                epochs = entry[1] if entry is not None else set()
                if workload_id not in self._ended:
                    older[workload_id] = (at, epochs)
            if epoch is not None:
                epochs.add(epoch)
        older.update(self._ended)
        self._ended = older

    def due(self, now: float) -> list[Leftover]:
        """The workloads whose files go now, forgotten here: those that ended `keep.seconds`
        ago or more, and the oldest of those beyond `keep.count`."""
        cutoff = now - self.keep.seconds
        out = []
        while self._ended:
            workload_id, (at, epochs) = next(iter(self._ended.items()))
            if at > cutoff and len(self._ended) <= self.keep.count:
                break
            del self._ended[workload_id]
            out.append(Leftover(workload_id, frozenset(epochs)))
        return out
