"""Who a local workload runs as: the spoke's own user, or a dedicated one (`run_as`).

The local runtime is no isolation boundary: a workload running as the spoke's user can read
whatever the spoke can, its credentials included. A spoke started as root can drop each
workload to a configured unprivileged user instead (`SpokeSettings.run_as`), so the files the
spoke keeps 0600/0700 (credentials, journal) are out of the workload's reach.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spoke.errors import PermanentSpokeError


@dataclass(frozen=True, slots=True)
class RunAs:
    """An unprivileged user workloads are started as (resolved once, at spoke start)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def resolve(cls, user: str) -> RunAs:
        """The user named `user`; raises PermanentSpokeError if the spoke is not root (only
        root may start processes as someone else), the user is unknown, or it is root."""
        if os.geteuid() != 0:
            raise PermanentSpokeError(
                f"run_as={user!r} needs the spoke to run as root (it starts each workload as "
                "that user); without root, run the spoke itself as the user workloads should have"
            )
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise PermanentSpokeError(f"run_as: no user {user!r} on this machine") from None
        if entry.pw_uid == 0:
            raise PermanentSpokeError("run_as must name an unprivileged user, not root")
        groups = tuple(os.getgrouplist(user, entry.pw_gid))
        return cls(user, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    def spawn_options(self) -> dict[str, Any]:
        """Keyword arguments of `asyncio.create_subprocess_exec` that start a process as this
        user, with its own groups (not root's)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def environment(self) -> dict[str, str]:
        """The identity variables of this user (instead of the spoke's)."""
        return {"HOME": self.home, "USER": self.user, "LOGNAME": self.user}

    def give(self, path: Path) -> None:
        """Make `path` this user's (a file or directory the workload must write)."""
        os.chown(path, self.uid, self.gid)
