"""Start local processes and learn when they end, without asyncio's subprocess machinery.

asyncio's `create_subprocess_exec` builds a transport, a protocol and a child watcher per
process and forks through `subprocess.Popen`: about 0.6 ms of the spoke's CPU per start on
the development machine, against 0.1 ms for `os.posix_spawn` (a vfork-style clone). A start is
the one per-workload cost a spoke cannot batch, so it uses `posix_spawn` and waits for the exit
on a pidfd (a thread blocked in `waitpid` where the platform has no pidfd). The pidfds of all
children sit in one epoll set of their own, read by one reader on the event loop: a pidfd
registered with the loop itself costs a selector key, a handle and a callback each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

#: Signals Python ignores in its own process; a child must get them back at their default.
_RESET_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGPIPE", None), getattr(signal, "SIGXFSZ", None)) if s
)


class Child:
    """A process this spoke started: its pid, and its exit status once it ended.

    `returncode` is None while it runs, then its exit code, or minus the signal that ended it.
    """

    __slots__ = ("_done", "_fd", "pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._fd: int | None = None
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        """Its exit status, once it ended (cancelling the wait leaves the watch in place)."""
        return await asyncio.shield(self._done)

    def detach(self) -> None:
        """Stop watching it (the spoke is stopping; the process runs on)."""
        if self._fd is not None:
            with contextlib.suppress(RuntimeError):  # no loop (any more): nothing watches
                _exits().forget(self._fd)
            os.close(self._fd)
            self._fd = None

    def _reap(self) -> None:
        self.detach()
        try:
            _, status = os.waitpid(self.pid, 0)  # it has exited: this does not block
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            code = 255  # reaped by someone else: its status is lost (asyncio reports 255 too)
        self._ended(code)

    def _ended(self, code: int) -> None:
        self.returncode = code
        if not self._done.done():
            self._done.set_result(code)


def spawn(
    argv: Sequence[str], env: Mapping[str, str], stdin: int, output: int, cwd: str | None = None
) -> Child:
    """Start `argv` (argv[0] an absolute path) in its own session, stdin from `stdin`, stdout
    and stderr to `output`, and watch for its end.

    Raises OSError when it cannot start: the program or `cwd` missing or not accessible.
    Returns once the process exists, not when it ends.
    """
    if cwd is not None:
        # posix_spawn cannot change directory before the exec here: the caller's wrapper
        # does, and a missing or closed directory fails the start as Popen would.
        if not os.path.isdir(cwd):
            raise FileNotFoundError(2, os.strerror(2), cwd)
        if not os.access(cwd, os.X_OK):
            raise PermissionError(13, os.strerror(13), cwd)
    pid = os.posix_spawn(
        argv[0],
        list(argv),
        env,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, stdin, 0),
            (os.POSIX_SPAWN_DUP2, output, 1),
            (os.POSIX_SPAWN_DUP2, output, 2),
        ],
        setsid=True,
        setsigmask=(),
        setsigdef=_RESET_SIGNALS,
    )
    child = Child(pid)
    _watch(child)
    return child


async def spawn_as(
    argv: Sequence[str], env: Mapping[str, str], output: int, cwd: str | None, options: Any
) -> asyncio.subprocess.Process:
    """Start `argv` as `spawn` does, under the identity in `options` (Popen's `user`, `group`,
    `extra_groups`): asyncio's subprocess path, which can change user before the exec."""
    return await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=output,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        **options,
    )


class _Exits:
    """The pidfds of one event loop's children in one epoll set, which the loop reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._epoll = select.epoll()
        self._children: dict[int, Child] = {}  # pidfd -> its child
        loop.add_reader(self._epoll.fileno(), self._ready)

    def watch(self, fd: int, child: Child) -> None:
        self._children[fd] = child
        self._epoll.register(fd, select.EPOLLIN)

    def forget(self, fd: int) -> None:
        if self._children.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    def _ready(self) -> None:
        for fd, _ in self._epoll.poll(0):
            child = self._children.get(fd)
            if child is not None:
                child._reap()


#: Each event loop's watcher (tests run many loops, one after the other).
_LOOP_EXITS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Exits] = (
    weakref.WeakKeyDictionary()
)


def _exits() -> _Exits:
    loop = asyncio.get_running_loop()
    exits = _LOOP_EXITS.get(loop)
    if exits is None:
        exits = _LOOP_EXITS[loop] = _Exits(loop)
    return exits


def _watch(child: Child) -> None:
    try:
        child._fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):  # no pidfd (not Linux, or an old kernel)
        loop = asyncio.get_running_loop()
        waited = loop.run_in_executor(None, os.waitpid, child.pid, 0)
        waited.add_done_callback(lambda f: child._ended(_status(f)))
        return
    _exits().watch(child._fd, child)


def _status(waited: asyncio.Future[tuple[int, int]]) -> int:
    if waited.cancelled() or waited.exception() is not None:
        return 255
    return os.waitstatus_to_exitcode(waited.result()[1])
