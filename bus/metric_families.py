"""Prometheus metric families declared as data: shared by the hub, spoke and burst collectors.

Each collector builds fresh families at scrape time. Declaring them as `Spec`s keeps the name,
help, type and labels of a family in one line, and `nats_reconnects` is the one family every
service exports under the same name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Family = GaugeMetricFamily | CounterMetricFamily


@dataclass(frozen=True)
class Spec:
    """One metric family: its type, name, help text and label names."""

    kind: Literal["gauge", "counter"]
    name: str
    help: str
    labels: tuple[str, ...] = ()

    def build(self) -> Family:
        cls = GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily
        return cls(self.name, self.help, labels=list(self.labels))


def gauge(name: str, help: str, labels: str = "") -> Spec:
    """A gauge; `labels` names its labels, separated by spaces."""
    return Spec("gauge", name, help, tuple(labels.split()))


def counter(name: str, help: str, labels: str = "") -> Spec:
    """A counter; `labels` names its labels, separated by spaces."""
    return Spec("counter", name, help, tuple(labels.split()))


def nats_reconnects(help: str, labels: str = "") -> Spec:
    """The reconnect counter of a service's NATS connection (same name in every service)."""
    return counter("gpufed_nats_reconnects", help, labels)


def build(specs: Mapping[str, Spec]) -> dict[str, Family]:
    """Fresh, empty families for one scrape, keyed as `specs` is."""
    return {key: spec.build() for key, spec in specs.items()}


def describe(specs: Mapping[str, Spec]) -> Iterable[Metric]:
    """What a collector's `describe()` returns: the families without samples."""
    return list(build(specs).values())
