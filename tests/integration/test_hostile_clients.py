"""Clients that try to starve the others (docs/security.md): each case lets a hostile client
do its worst against a real daemon and checks that a bystander client, a process of its own,
still gets its work done and its results exact."""

from __future__ import annotations

import signal
import time

from conftest import children_of, descendants, run_client, start_client

from simnpu.client.tools.query import query

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
