"""Worker processes end with their daemon, even in the middle of a kernel."""

from __future__ import annotations

import signal
import time

from conftest import alive

from simnpu.client.runtime import Runtime

SLEEPER = """
import pathlib
import time
from simnpu import kernel


@kernel()
def sleep_long(ctx):
    pathlib.Path({marker!r}).write_text("running")
    time.sleep(120)
"""


def test_a_worker_busy_in_a_kernel_dies_with_a_killed_daemon(start_daemon, tmp_path):
    daemon = start_daemon()
    marker = tmp_path / "running"
    runtime = Runtime(daemon.address)
    try:
        runtime.set_device(0)
        binary = runtime.binary_load(SLEEPER.format(marker=str(marker)))
        sleeper = runtime.get_function(binary, "sleep_long")
        runtime.launch_kernel(sleeper, 1, b"", runtime.create_stream())
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, "the kernel never started"
            time.sleep(0.02)
        assert daemon.workers and all(alive(pid) for pid in daemon.workers)
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in daemon.workers):
            assert time.monotonic() < deadline, "a worker outlived its killed daemon"
            time.sleep(0.05)
        assert not daemon.segments(), "the killed daemon's segments were not unlinked"
    finally:
        runtime.close()
