"""Whether a recorded pid is still a local cloud spoke, from what /proc shows of it."""

from __future__ import annotations

from burst.providers.local import running_as

SPOKE = b"/usr/bin/python3\0-m\0gpufed\0spoke\0--id\0b-1\0--kind\0cloud\0"
#: /proc/PID/stat of a running process, a zombie and a kernel thread (flags 0x00208040).
RUNNING = "4242 (python3) R 1 4242 4242 0 -1 4194560 130 0 0 0 0 0 0 0 20 0 1 0 1212310"
ZOMBIE = "4242 (python3) Z 1 4242 4242 0 -1 4194564 130 0 0 0 0 0 0 0 20 0 1 0 1212310"
KTHREAD = "4242 (kworker/0:1) I 2 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 1212310"


def test_a_process_with_its_arguments_is_ours_only_if_they_name_its_instance() -> None:
    assert running_as("b-1", SPOKE, "") is True
    assert running_as("b-2", SPOKE, "") is False  # another instance's spoke
    assert running_as("b-1", b"sleep\0600\0", "") is False  # a reused pid


def test_a_process_between_two_programs_has_not_ended_but_is_not_known_as_ours() -> None:
    # No arguments while it exits (or execs): it has not ended, which `terminate` waits for,
    # and it is not signalled as ours.
    assert running_as("b-1", b"", RUNNING) is None
    assert running_as("b-1", b"", ZOMBIE) is False  # ended: only its exit status is left
    assert running_as("b-1", b"", KTHREAD) is False  # never had arguments: not ours
