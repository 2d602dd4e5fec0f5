"""A session that ended leaves nothing behind in the daemon: a thousand short sessions do
not grow its memory.

Python's allocator keeps memory it once used, so the daemon's resident size is compared
between session 200 and session 1,000, not from its start. A session kept alive after its
end (its handles, queues, fast path, streams) weighed 4-6 KiB of resident memory here:
800 of them grew the daemon by 3-4.5 MiB, where ended sessions that are let go leave it
within half a MiB of where it was; the bound is set between the two.
"""

from __future__ import annotations

import os
import time

import pytest

from simnpu.client.runtime import Runtime
from simnpu.proto import commands

SESSIONS = 1000
MEASURED_FROM = 200
MiB = 1 << 20
BOUND = 2 * MiB


def rss(pid: int) -> int:
    """The resident size of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def malloc_and_free(address: str) -> None:
    rt = Runtime(address)
    rt.contexts.set_device(0)
    rt.memory.free(rt.memory.malloc(4096))
    rt.close()


def launch_and_synchronize(address: str) -> None:
    """A launch and a synchronize with a timeout (the daemon answers it: the client's
    bytes travel in-stream, see the fixture), no memory."""
    rt = Runtime(address)
    rt.contexts.set_device(0)
    empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")
    rt.kernels.launch_kernel(empty, 1, b"", 0)
    rt.sync.synchronize_stream(0, 60_000)
    rt.close()


@pytest.mark.slow
@pytest.mark.parametrize("session", [malloc_and_free, launch_and_synchronize])
def test_short_sessions_do_not_grow_the_daemon(start_daemon, monkeypatch, session):
    if session is launch_and_synchronize:  # synchronize goes to the daemon, with its timeout
        monkeypatch.setenv("SIMNPU_NO_SHM", "1")
    daemon = start_daemon()
    started = time.monotonic()
    for number in range(1, SESSIONS + 1):
        session(daemon.address)
        if number == MEASURED_FROM:
            before = rss(daemon.pid)
    growth = rss(daemon.pid) - before
    print(
        f"{session.__name__}: {SESSIONS} sessions in {time.monotonic() - started:.1f} s, "
        f"daemon RSS {before / MiB:.1f} MiB at session {MEASURED_FROM}, "
        f"+{growth / MiB:.2f} MiB by session {SESSIONS}"
    )
    assert growth <= BOUND, (
        f"the daemon grew by {growth / MiB:.1f} MiB over {SESSIONS - MEASURED_FROM} sessions "
        f"that had ended (pid {os.getpid()} made them)"
    )
