"""Scheduling policy: priority classes (teams and quotas come with the policy engine)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Default priority classes, highest first.
DEFAULT_PRIORITIES: Mapping[str, int] = {
    "production": 1000,
    "training": 500,
    "dev": 300,
    "batch": 100,
}


@dataclass(frozen=True, slots=True)
class Policy:
    """Global policy the placement core decides with."""

    priorities: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PRIORITIES))

    def priority(self, class_name: str) -> int:
        """Value of a priority class; unknown classes rank lowest."""
        return self.priorities.get(class_name, 0)
