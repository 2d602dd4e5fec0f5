"""Clients that try to starve the others (docs/security.md): each case lets a hostile client
do its worst against a real daemon and checks that a bystander client, a process of its own,
still gets its work done and its results exact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import children_of, descendants, run_client, start_client

from simnpu.client.tools.query import query
from simnpu.proto import codes

BYSTANDER = """
import numpy as np
import simnpu.client as npu

a = np.arange(1024, dtype=np.float32)
with npu.Device(0):
    x, y, z = (npu.DeviceBuffer.from_array(v) for v in (a, 2 * a, np.zeros_like(a)))
    for _ in range(ROUNDS):
        z.fill(0)
        npu.builtin("add_f32").launch(2, x, y, z, a.size)
        npu.current_stream().synchronize(30000)
        assert np.array_equal(z.to_numpy(np.float32), 3 * a)
    print("exact", flush=True)
"""


def bystander(address: str, rounds: int = 20) -> None:
    """Another client's launches of a built-in kernel complete, exact, each synchronize
    within its 30 s timeout."""
    done = run_client(address, BYSTANDER.replace("ROUNDS", str(rounds)), timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "exact", done.stderr


def kernel_processes(daemon: int) -> list[int]:
    """The daemon's kernel processes: the children of its zygote."""
    return sorted(set(descendants(daemon)) - set(children_of(daemon)))


HOG = """
import sys
import simnpu.client as npu
from simnpu.client.device import runtime

SPIN = '''
from simnpu import kernel


@kernel()
def spin(ctx):
    while True:
        pass
'''
with npu.Device(0):
    runtime().kernels.set_op_execute_timeout(10**9)  # its kernels may run for ever
    spin = npu.Module.from_source(SPIN, "spin.py").function("spin")
    streams = [npu.Stream() for _ in range(2)]
    for stream in streams:
        with stream:
            spin.launch(1)
    print("launched", flush=True)
    sys.stdin.readline()
"""


def test_a_killed_clients_endless_kernels_end_with_it(start_daemon):
    """A client lets its kernels run for ever on both AI cores and is SIGKILLed: its
    kernel processes end, its session goes from `simnpu smi`, and another client's
    launches complete."""
    daemon = start_daemon()
    hog = start_client(daemon.address, HOG, stdin=True)
    try:
        assert hog.stdout.readline().strip() == "launched", hog.stderr.read()
        deadline = time.monotonic() + 60
        while True:  # a kernel process per AI core runs its kernels
            spinning = kernel_processes(daemon.pid)
            if len(spinning) == 2:
                break
            assert time.monotonic() < deadline, spinning
            time.sleep(0.05)
        hog.send_signal(signal.SIGKILL)
        hog.wait(30)
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
    bystander(daemon.address, rounds=5)
    deadline = time.monotonic() + 60
    while True:
        sessions = [p["pid"] for p in query("processes", address=daemon.address)["processes"]]
        left = set(spinning) & set(kernel_processes(daemon.pid))
        if hog.pid not in sessions and not left:
            break
        assert time.monotonic() < deadline, f"still there: sessions {sessions}, processes {left}"
        time.sleep(0.05)


# ---- the last of each resource -----------------------------------------------------------------
TAKER = """
import sys
from simnpu.client.runtime import Runtime
from simnpu.proto.errors import NpuError

rt = Runtime()
rt.contexts.set_device(0)
take = {
    "memory": lambda: rt.memory.malloc(1 << 20, 0),
    "streams": rt.streams.create_stream,
    "events": rt.events.create_event,
    "notifies": lambda: rt.notifies.create_notify(0),
    "cnt_notifies": lambda: rt.notifies.cnt_notify_create(0),
}[sys.argv[1]]
held = []
try:
    while True:
        held.append(take())
except NpuError as error:
    print(len(held), error.code, flush=True)
sys.stdin.readline()
"""

STARTER = """
import sys
from simnpu.client.runtime import Runtime

rt = Runtime()
rt.contexts.set_device(0)
take = {
    "memory": lambda: rt.memory.malloc(1 << 20, 0),
    "streams": rt.streams.create_stream,
    "events": rt.events.create_event,
    "notifies": lambda: rt.notifies.create_notify(0),
    "cnt_notifies": lambda: rt.notifies.cnt_notify_create(0),
}[sys.argv[1]]
print(len([take() for _ in range(int(sys.argv[2]))]))
"""

CAPACITY = {  # of the test daemon's device (--memory 256MiB: MiB) and the daemon's tables
    "memory": 256,
    "streams": codes.MAX_STREAMS_PER_DEVICE,
    "events": codes.MAX_EVENTS_PER_DEVICE,
    "notifies": 8192,
    "cnt_notifies": 8192,
}
CODE = {
    "memory": codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
    "streams": codes.ACL_ERROR_RT_NO_STREAM_RESOURCE,
    "events": codes.ACL_ERROR_RT_NO_EVENT_RESOURCE,
    "notifies": codes.ACL_ERROR_RT_NO_NOTIFY_RESOURCE,
    "cnt_notifies": codes.ACL_ERROR_RT_NO_NOTIFY_RESOURCE,
}
START = {"memory": 1, "streams": 4, "events": 16, "notifies": 4, "cnt_notifies": 4}


@pytest.mark.parametrize("kind", CAPACITY)
def test_two_greedy_processes_leave_another_enough_to_start(start_daemon, kind, tmp_path):
    """Two processes take all they can of a resource; a third still gets what a process
    needs to start, and the first alone got nearly all of it (all but the reserve, or its
    per-client limit)."""
    daemon = start_daemon()
    script = tmp_path / "taker.py"
    script.write_text(TAKER)
    takers = []
    try:
        taken = []
        for _ in range(2):
            taker = subprocess.Popen(
                [sys.executable, str(script), kind],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
            )
            takers.append(taker)
            line = taker.stdout.readline()
            assert line, taker.stderr.read()
            count, code = (int(word) for word in line.split())
            assert code == CODE[kind]
            taken.append(count)
        alone = CAPACITY[kind] * 15 // 16 - 1  # (a block of 1 MiB reserves a page more)
        if kind in ("streams", "events"):  # --max-streams-per-client, --max-events-...
            alone = min(alone, CAPACITY[kind] // 2 - 1)  # less its default stream
        assert taken[0] >= alone, taken
        starter = run_client(
            daemon.address, f"import sys; sys.argv = ['', {kind!r}, {START[kind]}]\n" + STARTER
        )
        assert starter.returncode == 0, starter.stderr
        assert int(starter.stdout) == START[kind]
    finally:
        for taker in takers:
            taker.communicate("done\n", timeout=60)


def test_greedy_processes_leave_another_a_session(start_daemon):
    """Four processes open all the sessions they may (at most 16 each, the daemon's 64 in
    all): they get all but the 8 kept, and a fifth still gets one."""
    daemon = start_daemon()
    hold = """
import sys
from simnpu.client.runtime import Runtime
from simnpu.proto.errors import NpuError
held = []
try:
    while True:
        held.append(Runtime())
except NpuError as error:
    print(len(held), error.code, flush=True)
sys.stdin.readline()
"""
    holders = [start_client(daemon.address, hold, stdin=True) for _ in range(4)]
    try:
        counts = [int(holder.stdout.readline().split()[0]) for holder in holders]
        assert sum(counts) == 64 - 8 and max(counts) <= 16, counts
        other = run_client(
            daemon.address,
            "from simnpu.client.runtime import Runtime\nRuntime().close()\nprint('in')",
        )
        assert other.stdout.strip() == "in", other.stderr
    finally:
        for holder in holders:
            holder.communicate("done\n", timeout=60)
