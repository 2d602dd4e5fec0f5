"""Chaos soak: client processes loop over random device work while a chaos loop SIGKILLs
client processes (and starts them again) and the daemon's own processes (its workers, and
whatever else it forked, children or grandchildren). No returned result may be wrong, no
client may hang, and once every client is gone the device memory and shared memory are as
they were before, with the daemon alive and no traceback in its log.

The short form runs in the normal suite; the long form, the same code for
SIMNPU_SOAK_SECONDS (default 300), is skipped unless `-m` names it (`pytest -m soak`).
SIMNPU_SOAK_SEED replays a seed; the seed in use is printed and named by every failure.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    DaemonProcess,
    alive,
    descendants,
    internal_errors,
    runtime_of,
    simnpu_segments,
)

from simnpu.proto import codes

SHORT_SECONDS = 25.0
LONG_SECONDS = float(os.environ.get("SIMNPU_SOAK_SECONDS", "300"))
CLIENTS = 3  # client processes at any time (the machine may have only two cores)
HANG_S = 120.0  # a client with no finished operation for this long hangs
SETTLE_S = 60.0  # what the daemon may take to take back a killed client's memory
WAIT_MS = 60_000  # every synchronize of a client waits at most this long

# One client process: loops over random operations until the stop file exists, printing
# one line per operation: "ok OP", "failed OP CODE" (a task lost with a killed worker),
# "unexpected OP CODE MESSAGE" or "wrong OP WHAT"; "done" after cleaning up.
CLIENT = r'''
import ctypes
import os
import random
import sys

import numpy as np

from simnpu.client.runtime import Runtime
from simnpu.proto import codes, commands
from simnpu.proto.errors import NpuError

LOST = {codes.ACL_ERROR_RT_AICORE_EXCEPTION, codes.ACL_ERROR_RT_SYS_DMA}  # a worker was killed
PARSER_LOST = codes.ACL_ERROR_RT_INTERNAL_ERROR  # what a load says when its parser was killed
WAIT_MS = int(os.environ["CHAOS_WAIT_MS"])
STOP = os.environ["CHAOS_STOP"]
MiB = 1 << 20
H2D, D2H, D2D = (
    codes.ACL_MEMCPY_HOST_TO_DEVICE,
    codes.ACL_MEMCPY_DEVICE_TO_HOST,
    codes.ACL_MEMCPY_DEVICE_TO_DEVICE,
)
KERNELS = """
import time

import numpy as np

from simnpu import kernel


@kernel("ptr", "ptr", "u32", "f32", "f64")
def axpy_slowly(ctx, x, y, n, k, pause):
    \"\"\"y = k * x + y over this block's slice, after `pause` seconds.\"\"\"
    time.sleep(pause)
    base, extra = divmod(n, ctx.block_num)
    start = ctx.block_idx * base + min(ctx.block_idx, extra)
    count = base + (ctx.block_idx < extra)
    if count:
        xs = ctx.gm(x + 4 * start, "float32", count, access="r")
        ys = ctx.gm(y + 4 * start, "float32", count)
        ys[:] = xs * np.float32(k) + ys
"""


class Wrong(Exception):
    """Data the device returned differs from what it must be."""


def say(*words):
    print(*words, flush=True)


rng = random.Random(os.environ["CHAOS_SEED"])
data = np.random.default_rng(rng.getrandbits(64))
rt = Runtime()
rt.contexts.set_device(0)
streams = [rt.streams.create_stream() for _ in range(2)]
add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
blocks = []  # device memory of the malloc/free operation


class Device:
    """Device memory for one operation, freed after it."""

    def __init__(self, *sizes):
        self.sizes = sizes
        self.ptrs = []

    def __enter__(self):
        try:
            for size in self.sizes:
                self.ptrs.append(rt.memory.malloc(size))
        except BaseException:
            self.__exit__()
            raise
        return self.ptrs

    def __exit__(self, *exc):
        for ptr in self.ptrs:
            rt.memory.free(ptr)


class Pinned:
    """Pinned host memory as a numpy byte array, freed after the operation."""

    def __init__(self, size):
        self.address = rt.host.malloc_host(size)
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(self.address))

    def __enter__(self):
        return self.array

    def __exit__(self, *exc):
        del self.array
        rt.host.free_host(self.address)


def settle(*used):
    """Synchronize every stream used, all of them even when one reports a failure."""
    failure = None
    for stream in used:
        try:
            rt.sync.synchronize_stream(stream, WAIT_MS)
        except NpuError as error:
            failure = failure or error
    if failure is not None:
        raise failure


def expect(what, got, want):
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        raise Wrong(f"{what}: {bad.size} of {want.size} elements differ, first at {bad[0]}")


def size():
    return rng.choice([rng.randrange(1, 64 * 1024), rng.randrange(1, 4 * MiB), 24 * MiB])


def floats(n):
    return data.integers(-1000, 1000, n).astype(np.float32)


def load():
    """The user kernel, from a module loaded now: (binary, function)."""
    binary = rt.kernels.binary_load(KERNELS, "chaos_kernels.py")
    return binary, rt.kernels.get_function(binary, "axpy_slowly")


def reload():
    """Load the user module again, unload the one before."""
    global binary, axpy
    old = binary
    binary, axpy = load()
    rt.kernels.binary_unload(old)


def malloc_free():
    if blocks and (len(blocks) >= 8 or rng.random() < 0.5):
        rt.memory.free(blocks.pop(rng.randrange(len(blocks))))
    else:
        blocks.append(rt.memory.malloc(rng.randrange(1, 2 * MiB)))


def copy_pageable():
    source = data.integers(0, 256, size(), dtype=np.uint8)
    back = np.zeros_like(source)
    with Device(source.nbytes) as (ptr,):
        rt.memory.memcpy(ptr, source.nbytes, source.ctypes.data, source.nbytes, H2D)
        rt.memory.memcpy(back.ctypes.data, back.nbytes, ptr, back.nbytes, D2H)
    expect("pageable H2D then D2H", back, source)


def copy_pinned_async():
    count = size()
    with Pinned(count) as source, Pinned(count) as back, Device(count, count) as (a, b):
        source[:] = data.integers(0, 256, count, dtype=np.uint8)
        stream = rng.choice(streams)
        rt.memory.memcpy_async(a, count, source.ctypes.data, count, H2D, stream)
        rt.memory.memcpy_async(b, count, a, count, D2D, stream)
        rt.memory.memcpy_async(back.ctypes.data, count, b, count, D2H, stream)
        settle(stream)
        expect("pinned H2D, D2D, D2H", back, source)


def memset():
    count, value = size(), rng.randrange(256)
    back = np.zeros(count, np.uint8)
    with Device(count) as (ptr,):
        rt.memory.memset_async(ptr, count, value, count, streams[0])
        settle(streams[0])
        rt.memory.memcpy(back.ctypes.data, count, ptr, count, D2H)
    expect("memset", back, np.full(count, value, np.uint8))


def launch_add(stream, x, y, z, n):
    args = rt.kernels.signature(add).pack(x, y, z, n)
    rt.kernels.launch_kernel(add, rng.randrange(1, 9), args, stream)


def launch_axpy(stream, x, y, n, k):
    pause = rng.choice([0.0, rng.uniform(0, 0.05)])
    args = rt.kernels.signature(axpy).pack(x, y, n, k, pause)
    rt.kernels.launch_kernel(axpy, rng.randrange(1, 5), args, stream)


def kernels():
    """add_f32, then the user kernel on its result, on one stream."""
    n = rng.randrange(1, 1 << 20)
    a, b, k = floats(n), floats(n), float(rng.randrange(-4, 5))
    out = np.zeros(n, np.float32)
    with Device(4 * n, 4 * n, 4 * n) as (x, y, z):
        rt.memory.memcpy(x, 4 * n, a.ctypes.data, 4 * n, H2D)
        rt.memory.memcpy(y, 4 * n, b.ctypes.data, 4 * n, H2D)
        stream = rng.choice(streams)
        launch_add(stream, x, y, z, n)
        launch_axpy(stream, x, z, n, k)
        if rng.random() < 0.5:
            rt.sync.synchronize_device(WAIT_MS)
        settle(stream)
        rt.memory.memcpy(out.ctypes.data, 4 * n, z, 4 * n, D2H)
    expect("add_f32 then axpy_slowly", out, a * np.float32(k) + (a + b))


def events():
    """add_f32 on one stream, the user kernel on the other after an event of the first."""
    n = rng.randrange(1, 1 << 18)
    a, b, k = floats(n), floats(n), float(rng.randrange(-4, 5))
    out = np.zeros(n, np.float32)
    first, second = rt.events.create_event(), rt.events.create_event()
    try:
        with Device(4 * n, 4 * n, 4 * n) as (x, y, z):
            rt.memory.memcpy(x, 4 * n, a.ctypes.data, 4 * n, H2D)
            rt.memory.memcpy(y, 4 * n, b.ctypes.data, 4 * n, H2D)
            launch_add(streams[0], x, y, z, n)
            rt.events.record_event(first, streams[0])
            rt.events.stream_wait_event(streams[1], first)
            launch_axpy(streams[1], y, z, n, k)
            rt.events.record_event(second, streams[1])
            rt.sync.synchronize_event(second, WAIT_MS)
            settle(*streams)  # a failure before an event's record is reported by its stream
            rt.memory.memcpy(out.ctypes.data, 4 * n, z, 4 * n, D2H)
    finally:
        rt.events.destroy_event(first)
        rt.events.destroy_event(second)
    expect("add_f32, event, axpy_slowly", out, b * np.float32(k) + (a + b))


for _ in range(20):  # the daemon's parser of the module may be killed too
    try:
        binary, axpy = load()
        break
    except NpuError as error:
        if error.code != PARSER_LOST:
            raise
        say("failed", "load", error.code)
else:
    raise SystemExit("the kernel module never loaded")
OPERATIONS = [malloc_free, copy_pageable, copy_pinned_async, memset, kernels, events, reload]
while not os.path.exists(STOP):
    operation = rng.choice(OPERATIONS)
    try:
        operation()
    except NpuError as error:
        if error.code in LOST or (operation is reload and error.code == PARSER_LOST):
            say("failed", operation.__name__, error.code)
        else:
            say("unexpected", operation.__name__, error.code, repr(error))
    except Wrong as wrong:
        say("wrong", operation.__name__, wrong)
    else:
        say("ok", operation.__name__)
for ptr in blocks:
    rt.memory.free(ptr)
for stream in streams:
    rt.streams.destroy_stream(stream)
rt.kernels.binary_unload(binary)
rt.close()
say("done")
'''


def kill_descendant(daemon_pid: int, pid: int) -> bool:
    """SIGKILL `pid` if it is still a descendant of the daemon (a pidfd, so a reused pid is
    never hit); whether it was."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if pid not in descendants(daemon_pid):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except ProcessLookupError:  # it ended meanwhile
        return False
    finally:
        os.close(fd)


class Client:
    """One client process and the tally of the lines it printed."""

    def __init__(self, address: str, seed: str, stop: Path, stderr: Path):
        self.name = seed
        self.stderr_path = stderr
        self.tally: collections.Counter[str] = collections.Counter()
        self.bad: list[str] = []  # "wrong" and "unexpected" lines
        self.done = False
        self.last_progress = time.monotonic()
        with open(stderr, "w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CLIENT],
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env={
                    **os.environ,
                    "SIMNPU_ADDRESS": address,
                    "CHAOS_SEED": seed,
                    "CHAOS_STOP": str(stop),
                    "CHAOS_WAIT_MS": str(WAIT_MS),
                },
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            words = line.split()
            self.last_progress = time.monotonic()
            if words == ["done"]:
                self.done = True
            elif words:
                self.tally[words[0]] += 1
                if words[0] in ("wrong", "unexpected"):
                    self.bad.append(f"{self.name}: {line.strip()}")

    def stalled(self) -> bool:
        return self.process.poll() is None and time.monotonic() - self.last_progress > HANG_S

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)
        self._close()

    def _close(self) -> None:
        self._reader.join(30)
        assert self.process.stdout is not None
        self.process.stdout.close()

    def finish(self) -> str | None:
        """Wait for the process to end after the stop file appeared; what went wrong."""
        while self.process.poll() is None and not self.stalled():
            time.sleep(0.1)
        if self.process.poll() is None:
            self.kill()
            return f"{self.name} made no progress for {HANG_S:.0f} s"
        self._close()
        if self.process.returncode != 0 or not self.done:
            errors = self.stderr_path.read_text(errors="replace")[-3000:]
            return f"{self.name} exited with {self.process.returncode}:\n{errors}"
        return None


def free_memory(address: str) -> int:
    with runtime_of(address) as rt:
        return rt.memory.get_mem_info(codes.ACL_HBM_MEM)[0]


def chaos(daemon: DaemonProcess, tmp_path: Path, seconds: float) -> None:
    seed = os.environ.get("SIMNPU_SOAK_SEED") or str(random.randrange(1 << 32))
    print(f"chaos soak: seed {seed} (SIMNPU_SOAK_SEED replays it), {seconds:.0f} s")
    rng = random.Random(seed)
    stop = tmp_path / "stop"
    own_segments = daemon.segments()
    initial_free = free_memory(daemon.address)
    started = 0

    def start(slot: int) -> Client:
        nonlocal started
        started += 1
        name = f"{seed}-{slot}-{started}"
        return Client(daemon.address, name, stop, tmp_path / f"client-{name}.err")

    clients = [start(slot) for slot in range(CLIENTS)]
    gone: list[Client] = []
    kills: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end and not problems:
            time.sleep(rng.uniform(0.2, 1.2))
            problems += [
                f"{c.name} made no progress for {HANG_S:.0f} s" for c in clients if c.stalled()
            ]
            if rng.random() < 0.3:
                slot = rng.randrange(len(clients))
                clients[slot].kill()
                gone.append(clients[slot])
                clients[slot] = start(slot)
                kills["client"] += 1
            else:
                victims = descendants(daemon.pid)
                if victims and kill_descendant(daemon.pid, rng.choice(victims)):
                    kills["daemon process"] += 1
            problems += [
                f"{c.name} exited with {c.process.returncode}"
                for c in clients
                if c.process.poll() is not None
            ]
    finally:
        stop.touch()
        problems += [problem for c in clients if (problem := c.finish()) is not None]
    tally = sum((c.tally for c in gone + clients), collections.Counter())
    summary = f"seed {seed}: {dict(tally)}, killed {dict(kills)}, {started} clients"
    print(summary)
    bad = [line for c in gone + clients for line in c.bad]
    assert not problems and not bad, f"{summary}\n" + "\n".join(problems + bad)
    assert tally["ok"] > 0, summary
    pids = [c.process.pid for c in gone + clients]
    given_back(daemon, summary, initial_free, own_segments, pids)


def given_back(
    daemon: DaemonProcess,
    summary: str,
    initial_free: int,
    own_segments: list[str],
    clients: list[int],
) -> None:
    """With every client (pids `clients`) gone: the daemon is alive, has `initial_free`
    bytes of device memory free again and only `own_segments`, no segment is named after a
    client, its log has no traceback; and once stopped, none of its processes is left."""
    assert daemon.process.poll() is None, f"{summary}: the daemon died\n{daemon.output()}"
    deadline = time.monotonic() + SETTLE_S
    while (free := free_memory(daemon.address)) != initial_free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert free == initial_free, f"{summary}: {initial_free - free} bytes of device memory kept"
    client_prefixes = tuple(f"simnpu-{pid}-" for pid in clients)
    deadline = time.monotonic() + SETTLE_S
    while daemon.segments() != own_segments and time.monotonic() < deadline:
        time.sleep(0.2)
    assert daemon.segments() == own_segments, f"{summary}: segments left {daemon.segments()}"
    assert not [n for n in simnpu_segments() if n.startswith(client_prefixes)], summary
    assert not internal_errors(daemon.output()), f"{summary}\n{daemon.output()}"

    processes = descendants(daemon.pid)
    assert daemon.stop() == 0, f"{summary}\n{daemon.output()}"
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in processes if alive(pid)], f"{summary}: processes outlived the daemon"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(SHORT_SECONDS + 600)  # room for the hang and settle bounds to report
def test_killed_clients_and_daemon_processes_break_nothing(start_daemon, tmp_path):
    chaos(start_daemon(), tmp_path, SHORT_SECONDS)


@pytest.mark.soak
@pytest.mark.multiprocess
@pytest.mark.timeout(LONG_SECONDS + 600)
def test_the_long_chaos_soak(start_daemon, tmp_path, request):
    if "soak" not in request.config.getoption("markexpr"):
        pytest.skip("the long soak runs only when -m names it (-m soak)")
    chaos(start_daemon(), tmp_path, LONG_SECONDS)
