"""A lifeline: a pipe whose write end only `gpufed up` holds, so that what it did not start
itself ends with it too, even when it is killed outright.

`gpufed up` ties its own pieces to itself (`bus.processes.ends_with_us`), but the local burst
provider's cloud spokes are the controller's children, and outlive a restart of the controller
on purpose, as rented machines do. So `gpufed up` makes a pipe (`make`), keeps the write end,
and hands the read end to the burst controller (`handing`), which hands it to each cloud spoke
it starts. Nothing is ever written: when `gpufed up` ends, however it ends, the kernel closes
the write end and every holder of a read end reads end-of-file; a spoke that holds one stops
then (`watch`). A process given none (a real cloud machine, a spoke run by hand) has no
lifeline and nothing changes for it.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Mapping
from typing import NamedTuple

#: The environment variable that names a lifeline's read end in the process given one.
ENV = "GPUFED_LIFELINE_FD"


class Handed(NamedTuple):
    """What a child is started with to hold a lifeline (`handing`)."""

    pass_fds: tuple[int, ...]
    env: dict[str, str] | None  # None: this process's environment


def make() -> tuple[int, int]:
    """A new lifeline: (read end, write end), neither inherited unless handed on."""
    return os.pipe()


def passed(environ: Mapping[str, str] | None = None) -> int | None:
    """The read end this process was handed (`ENV`), or None: none named, or what it names is
    no pipe open here (a variable left in a shell must not make a spoke read another file)."""
    text = (os.environ if environ is None else environ).get(ENV, "")
    try:
        fd = int(text)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (ValueError, OSError):
        return None
    return fd


#: What a child holding no lifeline is started with.
NONE = Handed((), None)


def handing(fd: int | None) -> Handed:
    """`subprocess.Popen`'s `pass_fds` and `env` that hand read end `fd` on to a child (none,
    and this process's environment, for None)."""
    if fd is None:
        return NONE
    return Handed((fd,), {**os.environ, ENV: str(fd)})


def watch(fd: int, loop: asyncio.AbstractEventLoop, on_end: Callable[[], None]) -> None:
    """Call `on_end` once, when the lifeline `fd` ends (end-of-file: its writer is gone).

    The read end is kept from this process's own children (a workload never sees it, nor the
    variable that names it), and never read before it ends: nothing is written to it, so it
    turns readable only at end-of-file, and a read then does not block.
    """
    os.set_inheritable(fd, False)
    os.environ.pop(ENV, None)

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            on_end()

    loop.add_reader(fd, readable)
