"""Worker and kernel processes end with their daemon, even in the middle of a kernel."""

from __future__ import annotations

import signal
import time

from conftest import alive, descendants
from device_peek import peek

from simnpu.client.runtime import Runtime

SLEEPER = """
import time
from simnpu import kernel


@kernel("ptr")
def sleep_long(ctx, mark):
    ctx.gm(mark, "u8", 1)[0] = 1
    time.sleep(120)
"""


def test_a_process_busy_in_a_kernel_dies_with_a_killed_daemon(start_daemon):
    """The kernel process running a client's kernel, the zygote and the workers all end
    with a SIGKILLed daemon, and the daemon's segments are unlinked."""
    daemon = start_daemon()
    runtime = Runtime(daemon.address)
    try:
        runtime.set_device(0)
        mark = runtime.malloc(4096, 0)
        runtime.memset(mark, 4096, 0, 4096)
        binary = runtime.binary_load(SLEEPER)
        sleeper = runtime.get_function(binary, "sleep_long")
        runtime.launch_kernel(
            sleeper, 1, runtime.signature(sleeper).pack(mark), runtime.create_stream()
        )
        deadline = time.monotonic() + 60
        while peek(daemon.pid, mark, 1) != b"\x01":
            assert time.monotonic() < deadline, "the kernel never started"
            time.sleep(0.02)
        below = descendants(daemon.pid)
        assert len(below) > len(daemon.workers), "the kernel runs in a process of its own"
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in below):
            assert time.monotonic() < deadline, "a process outlived its killed daemon"
            time.sleep(0.05)
        assert not daemon.segments(), "the killed daemon's segments were not unlinked"
    finally:
        runtime.close()
