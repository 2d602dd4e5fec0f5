"""Worker and kernel processes end with their daemon, even in the middle of a kernel."""

from __future__ import annotations

import os
import signal
import time

from conftest import alive, children_of, descendants, round_trip
from device_peek import peek

from simnpu.client.runtime import Runtime
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

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
        runtime.contexts.set_device(0)
        mark = runtime.memory.malloc(4096, 0)
        runtime.memory.memset(mark, 4096, 0, 4096)
        binary = runtime.kernels.binary_load(SLEEPER)
        sleeper = runtime.kernels.get_function(binary, "sleep_long")
        runtime.kernels.launch_kernel(
            sleeper,
            1,
            runtime.kernels.signature(sleeper).pack(mark),
            runtime.streams.create_stream(),
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


MARKER = """
from simnpu import kernel


@kernel("ptr", "u8")
def mark(ctx, cell, value):
    ctx.gm(cell, "u8", 1)[0] = value
"""


def test_a_killed_kernel_zygote_is_replaced(start_daemon):
    """The zygote that forks kernel processes is SIGKILLed (its kernel processes die with
    it): the daemon starts another, says so in its log, and clients' kernels run again."""
    daemon = start_daemon()
    runtime = Runtime(daemon.address)
    try:
        runtime.contexts.set_device(0)
        cell = runtime.memory.malloc(4096, 0)
        mark = runtime.kernels.get_function(runtime.kernels.binary_load(MARKER), "mark")
        stream = runtime.streams.create_stream()
        runtime.kernels.launch_kernel(
            mark, 1, runtime.kernels.signature(mark).pack(cell, 1), stream
        )
        runtime.sync.synchronize_stream(stream)
        zygotes = [pid for pid in children_of(daemon.pid) if children_of(pid)]
        assert len(zygotes) == 1, "one child of the daemon has kernel processes"
        doomed = [zygotes[0], *descendants(zygotes[0])]
        os.kill(zygotes[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in doomed):  # its kernel processes die with it
            assert time.monotonic() < deadline, "a kernel process outlived its zygote"
            time.sleep(0.02)
        for value in (2, 3):  # the launch after the kill may find its process dead
            runtime.kernels.launch_kernel(
                mark, 1, runtime.kernels.signature(mark).pack(cell, value), stream
            )
            try:
                runtime.sync.synchronize_stream(stream)
            except NpuError as error:
                assert error.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
        assert peek(daemon.pid, cell, 1) == b"\x03"
        deadline = time.monotonic() + 30
        while "the kernel zygote was killed by signal 9 (SIGKILL); starting another" not in (
            daemon.output()
        ):
            assert time.monotonic() < deadline, daemon.output()
            time.sleep(0.02)
    finally:
        runtime.close()


def test_workers_still_booting_ignore_a_signal_to_the_daemons_group(start_daemon):
    """A device's workers start when a client first names the device, while the daemon
    serves: a SIGTERM meant for the daemon's process group (a Ctrl-C) that reaches them
    before they are up does not kill them."""
    daemon = start_daemon("--devices", "2")
    before = set(descendants(daemon.pid))
    runtime = Runtime(daemon.address)
    try:
        runtime.contexts.set_device(1)  # device 1's workers are launched now
        booting = set(descendants(daemon.pid)) - before
        assert len(booting) == 4  # 2 AI cores and 2 copy engines, just born
        for pid in booting:
            os.kill(pid, signal.SIGTERM)
        mark = runtime.memory.malloc(4096, 0)
        runtime.memory.memset(mark, 4096, 7, 4096)  # a copy engine of device 1
        runtime.sync.synchronize_device()
        assert all(alive(pid) for pid in booting)
        runtime.memory.free(mark)
    finally:
        runtime.close()
    assert " ERROR " not in daemon.output(), daemon.output()


def test_workers_outlive_the_session_that_started_them(start_daemon):
    """A device's workers start from the thread of the first session naming the device.
    That thread ends with the session, and the kernel then sends the workers their
    parent-death signal: they must tell a daemon thread's end from the daemon's."""
    daemon = start_daemon("--devices", "2")
    before = set(descendants(daemon.pid))
    first = Runtime(daemon.address)
    try:
        first.contexts.set_device(1)  # device 1's workers are launched from this session's thread
        started = set(descendants(daemon.pid)) - before
        round_trip(first)
    finally:
        first.close()  # its session's thread ends
    second = Runtime(daemon.address)
    try:
        second.contexts.set_device(1)
        round_trip(second)  # the first session's end is past once this one runs
    finally:
        second.close()
    assert len(started) == 4 and all(alive(pid) for pid in started)
    assert "SIGUSR2" not in daemon.output() and " ERROR " not in daemon.output(), daemon.output()
