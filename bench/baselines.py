"""The limits simnpu's figures are compared with, measured on the same machine in the same run.

Each function measures one bare mechanism (gRPC, pipes, numpy on shared memory, process
start-up) with nothing of simnpu in the path. `python bench/baselines.py serve ADDRESS`
runs the bare gRPC server the gRPC baselines talk to.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import struct
import subprocess
import sys
import threading
import time
from concurrent import futures

from simnpu.client import config
from simnpu.proto import service

config.prefer_fast_grpc()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from simnpu.shm.region import Region, segment_name  # noqa: E402

_ECHO = "/bench.Bare/Echo"  # bidi: every request message answered at once
_SINK = "/bench.Bare/Sink"  # bidi: counts bytes, answers once at the end
_IDENTITY = (lambda b: b, lambda b: b)


# ---- the bare server ------------------------------------------------------------------------
def serve(address: str) -> None:
    def echo(requests, context):
        for message in requests:
            yield message

    def sink(requests, context):
        total = 0
        for message in requests:
            total += len(message)
        yield struct.pack("<Q", total)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=service.CHANNEL_OPTIONS)
    handler = grpc.method_handlers_generic_handler(
        "bench.Bare",
        {
            "Echo": grpc.stream_stream_rpc_method_handler(echo, *_IDENTITY),
            "Sink": grpc.stream_stream_rpc_method_handler(sink, *_IDENTITY),
        },
    )
    server.add_generic_rpc_handlers([handler])
    server.add_insecure_port(address)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(0)


class BareServer:
    """The bare gRPC server in its own process, like the daemon."""

    def __init__(self, directory: str):
        self.address = f"unix://{directory}/bare.sock"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "serve", self.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("bare gRPC server did not start")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(10)


def _channel(address):
    return grpc.insecure_channel(address, options=service.CLIENT_CHANNEL_OPTIONS)


# ---- gRPC baselines ---------------------------------------------------------------------------
def ping_pong_us(address: str, rounds: int = 3000) -> tuple[float, float]:
    """p50, p99 of one message out and its answer back on an open bidi stream (µs)."""
    channel = _channel(address)
    outgoing: collections.deque = collections.deque()
    wake = threading.Event()

    def requests():
        while True:
            wake.wait()
            wake.clear()
            while outgoing:
                item = outgoing.popleft()
                if item is None:
                    return
                yield item

    call = channel.stream_stream(_ECHO, *_IDENTITY)(requests())
    samples = []
    message = b"x" * 48
    for i in range(rounds + 200):
        start = time.perf_counter()
        outgoing.append(message)
        wake.set()
        next(call)
        if i >= 200:
            samples.append(time.perf_counter() - start)
    outgoing.append(None)
    wake.set()
    channel.close()
    samples.sort()
    return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def packed_sender_rate(address: str, records: int = 100_000) -> float:
    """Records/s of a client that packs each record (48 bytes), appends it to a queue and lets
    one sender coalesce everything queued into stream messages (host side, until the last
    append returns)."""
    channel = _channel(address)
    queue: collections.deque = collections.deque()
    wake = threading.Event()
    done = threading.Event()
    layout = struct.Struct("<HIQQIQQH")

    def requests():
        while True:
            wake.wait()
            wake.clear()
            run = []
            while queue:
                run.append(queue.popleft())
            if run and run[-1] is None:
                run.pop()
                if run:
                    yield b"".join(run)
                done.set()
                return
            if run:
                yield b"".join(run)

    call = channel.stream_stream(_SINK, *_IDENTITY)(requests())
    start = time.perf_counter()
    for i in range(records):
        queue.append(layout.pack(1, 1, 7, 9, 0, i, 0, 0))
        if not wake.is_set():
            wake.set()
    elapsed = time.perf_counter() - start
    queue.append(None)
    wake.set()
    total = struct.unpack("<Q", next(call))[0]
    channel.close()
    assert total == records * layout.size
    return records / elapsed


def stream_bandwidth(address: str, nbytes: int, chunk: int = 1 << 20) -> float:
    """GB/s of streaming `nbytes` in `chunk`-byte messages to the bare server."""
    channel = _channel(address)
    payload = os.urandom(chunk)

    def requests():
        for _ in range(nbytes // chunk):
            yield payload

    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        reply = next(channel.stream_stream(_SINK, *_IDENTITY)(requests()))
        best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
        assert struct.unpack("<Q", reply)[0] == nbytes
    channel.close()
    return best


# ---- worker dispatch over a pipe --------------------------------------------------------------
def _pipe_worker(conn) -> None:
    while True:
        batch = conn.recv()
        if batch is None:
            return
        conn.send([(item[1], 0) for item in batch])


def pipe_dispatch_rate(tasks: int = 20_000, run: int = 1) -> float:
    """Empty tasks/s handed to a worker process over a pipe `run` at a time, awaited."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_pipe_worker, args=(child,), daemon=True)
    process.start()
    parent.send([("empty", 0)])
    parent.recv()
    start = time.perf_counter()
    for i in range(0, tasks, run):
        parent.send([("empty", j) for j in range(i, i + run)])
        parent.recv()
    elapsed = time.perf_counter() - start
    parent.send(None)
    process.join(5)
    return tasks / elapsed


# ---- shared-memory copies and numpy kernels -----------------------------------------------------
class ShmPair:
    """Two warm shared-memory buffers of `nbytes` (the memory simnpu's copies move between)."""

    def __init__(self, nbytes: int):
        self.regions = [Region.create(segment_name("bench", i), nbytes) for i in range(2)]
        self.arrays = [np.frombuffer(r.map, np.uint8) for r in self.regions]
        for array in self.arrays:
            array.fill(1)  # fault every page in

    def close(self) -> None:
        self.arrays = []
        for region in self.regions:
            region.close()


def shm_copy_bandwidth(nbytes: int) -> float:
    """GB/s of numpy copying between two warm shared-memory mappings (best of 5)."""
    pair = ShmPair(nbytes)
    try:
        best = 0.0
        for _ in range(5):
            start = time.perf_counter()
            np.copyto(pair.arrays[1], pair.arrays[0])
            best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        pair.close()


def _copy_process(nbytes: int, copies: int, rounds: int, barrier, results) -> None:
    pair = ShmPair(nbytes)
    try:
        np.copyto(pair.arrays[1], pair.arrays[0])  # warm
        for _ in range(rounds):
            barrier.wait()
            start = time.perf_counter()
            for _ in range(copies):
                np.copyto(pair.arrays[1], pair.arrays[0])
            results.put(time.perf_counter() - start)
    finally:
        pair.close()


def shm_copy_bandwidth_processes(
    nbytes: int = 64 << 20, processes: int = 2, copies: int = 4, rounds: int = 3
) -> float:
    """GB/s read plus written by `processes` processes at once, each copying `nbytes`
    between its own two warm shared-memory buffers (numpy copyto) `copies` times: a copy
    counts 2 x nbytes (it reads nbytes and writes nbytes); per round the bytes of every
    process over the slowest one's time, best of `rounds` rounds started together."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    children = [
        context.Process(target=_copy_process, args=(nbytes, copies, rounds, barrier, results))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    try:
        best = 0.0
        for _ in range(rounds):
            slowest = max(results.get(timeout=120) for _ in range(processes))
            best = max(best, processes * copies * 2 * nbytes / slowest / 1e9)
        return best
    finally:
        end_processes(children)


def end_processes(processes) -> None:
    """Join each multiprocessing process, killing (by its PID) one still running after 30 s."""
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(5)


def machine_busy_s() -> float:
    """CPU seconds this machine's CPUs have been busy since boot, all of them together
    (/proc/stat: user, nice, system, irq, softirq; not idle, I/O wait or time the hypervisor
    stole). Its change over a window is the CPU everything on the machine used in it."""
    with open("/proc/stat", encoding="ascii") as stat:
        user, nice, system, _, _, irq, softirq = (int(v) for v in stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def python_startup_ms(rounds: int = 5) -> float:
    """Median time to start Python with numpy and grpc imported (ms)."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy, grpc"], check=True)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2] * 1e3


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
