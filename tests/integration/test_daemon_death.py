"""A daemon SIGKILLed while its clients are in the middle of a big copy or blocked in a
synchronize: every call returns the code of a lost daemon (507899) at once, so does the
next one, the client closes and exits normally, and no process or segment of the daemon
is left."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from conftest import DaemonProcess, alive, descendants, start_client

from simnpu.proto import codes

BOUND_S = 60  # what a client may take to notice the daemon died, close and exit
LOST = codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR

# A client that gets into CALL, says "blocked" once it is about to, then reports what the
# call returned ("returned CODE"), what the next call returns ("then CODE"), and "closed".
CLIENT = r'''
import os

import numpy as np

from simnpu.client.runtime import Runtime
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

SLEEPER = """
import time

from simnpu import kernel


@kernel()
def sleep_long(ctx):
    time.sleep(120)
"""
SIZE = 256 << 20
FOREVER_MS = 600_000  # longer than the test waits: a call that returns did not time out
call = os.environ["DEATH_CALL"]
rt = Runtime()
rt.contexts.set_device(0)
if call.startswith("copy"):
    device = rt.memory.malloc(SIZE)
    if call == "copy pinned":
        host = rt.host.malloc_host(SIZE)
    else:
        buffer = np.ones(SIZE, np.uint8)
        host = buffer.ctypes.data

    def blocked():
        while True:  # back to back, so that the daemon dies in the middle of one
            rt.memory.memcpy(device, SIZE, host, SIZE, codes.ACL_MEMCPY_HOST_TO_DEVICE)
else:
    stream = rt.streams.create_stream()
    sleeper = rt.kernels.get_function(rt.kernels.binary_load(SLEEPER, "sleeper.py"), "sleep_long")
    rt.kernels.launch_kernel(sleeper, 1, b"", stream)
    event = rt.events.create_event()
    rt.events.record_event(event, stream)
    timeout = FOREVER_MS if call.endswith("with timeout") else -1
    what = call.split()[1]

    def blocked():
        if what == "stream":
            rt.sync.synchronize_stream(stream, timeout)
        elif what == "event":
            rt.sync.synchronize_event(event, timeout)
        else:
            rt.sync.synchronize_device(timeout)


print("blocked", flush=True)
try:
    blocked()
except NpuError as error:
    print("returned", error.code, flush=True)
else:
    print("returned 0", flush=True)
try:
    rt.memory.malloc(64)
except NpuError as error:
    print("then", error.code, flush=True)
else:
    print("then 0", flush=True)
rt.close()
print("closed", flush=True)
'''


def kill_with_clients_blocked(daemon: DaemonProcess, calls: list[str]) -> None:
    """Start a client per call, SIGKILL the daemon once all are in their calls, and check
    each client's report, exit, and that the daemon's processes and segments are gone."""
    clients = {
        call: start_client(daemon.address, CLIENT, env={"DEATH_CALL": call}) for call in calls
    }
    try:
        for call, client in clients.items():
            assert client.stdout is not None
            line = client.stdout.readline()
            assert line == "blocked\n", f"{call}: {line!r}\n{client.communicate()[1]}"
        time.sleep(1.0)  # into the calls (a copy client loops, so it is always in one)
        processes = descendants(daemon.pid)
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(BOUND_S)
        for call, client in clients.items():
            try:
                out, err = client.communicate(timeout=BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{call}: the client hung after its daemon died")
            assert client.returncode == 0 and "Traceback" not in err, f"{call}:\n{err}"
            assert out.split("\n") == [f"returned {LOST}", f"then {LOST}", "closed", ""], (
                f"{call}: {out}\n{err}"
            )
        deadline = time.monotonic() + BOUND_S
        while (
            any(alive(pid) for pid in processes) or daemon.segments()
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in processes if alive(pid)], "processes outlived the daemon"
        assert not daemon.segments(), f"the dead daemon's segments: {daemon.segments()}"
    finally:
        for client in clients.values():
            if client.poll() is None:
                client.kill()
                client.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("call", ["copy pageable", "copy pinned"])
def test_a_daemon_killed_in_the_middle_of_a_big_copy(start_daemon, call):
    kill_with_clients_blocked(start_daemon("--memory", "320MiB"), [call])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_daemon_killed_while_clients_synchronize(start_daemon):
    calls = [
        f"synchronize {what}{timeout}"
        for what in ("stream", "event", "device")
        for timeout in ("", " with timeout")
    ]
    kill_with_clients_blocked(start_daemon(), calls)
