"""simnpu's side of the benchmarks: each probe is a pyACL program run as its own process.

`python bench/probes.py NAME [ARGS...]` runs one probe against the daemon at
SIMNPU_ADDRESS and prints one JSON object. Everything goes through the `acl` facade, as a
user's program would.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

import numpy as np
import wakeups

import acl

H2D, D2H = acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_MEMCPY_DEVICE_TO_HOST


def check(ret, what="call"):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed with {ret}: {acl.get_recent_err_msg()}")


def value(result, what="call"):
    *values, ret = result
    check(ret, what)
    return values[0] if len(values) == 1 else values


def setup():
    check(acl.init(), "init")
    check(acl.rt.set_device(0), "set_device")
    return value(acl.rt.create_stream(), "create_stream")


def builtin(name):
    return value(acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, name), name)


_NO_ARGS = ctypes.create_string_buffer(1)  # acl refuses a null argument pointer, even for 0 bytes


def launch(func, blocks, stream, args: bytes = b""):
    if args:
        buffer = ctypes.create_string_buffer(args, len(args))
        return acl.rt.launch_kernel_with_host_args(
            func, blocks, stream, None, ctypes.addressof(buffer), len(args)
        )
    return acl.rt.launch_kernel_with_host_args(
        func, blocks, stream, None, ctypes.addressof(_NO_ARGS), 0
    )


def launch_and_synchronize(func, stream):
    """One launch of `func` (one block, no arguments) and a synchronize of its stream."""
    check(launch(func, 1, stream))
    check(acl.rt.synchronize_stream(stream))


def timed(call, count: int) -> list[float]:
    """The seconds each of `count` calls of `call()` took."""
    samples = []
    clock = time.perf_counter
    for _ in range(count):
        start = clock()
        call()
        samples.append(clock() - start)
    return samples


def launch_rate(count: str = "100000", together: str = ""):
    """Async empty-kernel launches per second, host side (until the last launch returns),
    and the calling thread's CPU per launch.
    With `together`, say "ready" once set up and start when the parent says "go" (so that
    several clients really launch at once)."""
    count = int(count)
    stream = setup()
    empty = builtin("empty")
    check(launch(empty, 1, stream), "launch")
    no_args = ctypes.addressof(_NO_ARGS)
    for _ in range(2000):
        check(launch(empty, 1, stream))
    check(acl.rt.synchronize_stream(stream))
    if together:
        print("ready", flush=True)
        sys.stdin.readline()
    failures = 0
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(count):  # what a pyACL program's launch loop is: the call and its check
        if acl.rt.launch_kernel_with_host_args(empty, 1, stream, None, no_args, 0):
            failures += 1
    host, cpu = time.perf_counter() - start, time.thread_time() - cpu
    if failures:
        raise SystemExit(f"{failures} launches failed: {acl.get_recent_err_msg()}")
    check(acl.rt.synchronize_stream(stream))
    total = time.perf_counter() - start
    return {
        "host_rate": count / host,
        "completed_rate": count / total,
        "client_cpu_us": cpu / count * 1e6,
    }


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 of samples in seconds, in µs."""
    samples = sorted(samples)
    return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def round_trip(rounds: str = "3000", batch: str = "100"):
    """Launch of an empty kernel + synchronize, p50 and p99 in µs, beside three chained
    process wake-ups (bench/wakeups.py) measured in alternate batches of `batch` rounds, so
    that both see the same machine."""
    stream = setup()
    empty = builtin("empty")
    rounds, batch = int(rounds), int(batch)

    def launches(count):
        return timed(lambda: launch_and_synchronize(empty, stream), count)

    with wakeups.Chain() as chain:
        launches(200)
        chain.rounds(200)
        simnpu, limit = [], []
        while len(simnpu) < rounds:
            simnpu += launches(min(batch, rounds - len(simnpu)))
            limit += chain.rounds(min(batch, rounds - len(limit)))
    p50, p99 = percentiles(simnpu)
    chain_p50, chain_p99 = percentiles(limit)
    return {"p50": p50, "p99": p99, "chain_p50": chain_p50, "chain_p99": chain_p99}


def malloc_pair(size: str = "4096", rounds: str = "3000", batch: str = "100"):
    """aclrtMalloc + aclrtFree of `size` bytes through acl, p50 and p99 in µs, beside launch
    + synchronize of an empty kernel measured in alternate batches of `batch` rounds."""
    stream = setup()
    empty = builtin("empty")
    size, rounds, batch = int(size), int(rounds), int(batch)

    def malloc_and_free():
        ptr = value(acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST), "malloc")
        check(acl.rt.free(ptr), "free")

    def launch_and_sync():
        launch_and_synchronize(empty, stream)

    timed(malloc_and_free, 200)
    timed(launch_and_sync, 200)
    pairs, limit = [], []
    while len(pairs) < rounds:
        pairs += timed(malloc_and_free, min(batch, rounds - len(pairs)))
        limit += timed(launch_and_sync, min(batch, rounds - len(limit)))
    check(acl.rt.synchronize_device())  # every free was accepted
    p50, p99 = percentiles(pairs)
    launch_p50, launch_p99 = percentiles(limit)
    return {"p50": p50, "p99": p99, "launch_p50": launch_p50, "launch_p99": launch_p99}


def signal_calls(rounds: str = "1000", batch: str = "100"):
    """Event synchronize, device synchronize, stream query and event query after an empty
    kernel, decided on the completion signals and (as before they were) by a request,
    beside launch + synchronize; batches of `batch` rounds of each, interleaved. p50 and
    p99 in µs per kind: a synchronize is timed with its launch (and record), a query alone,
    after its work completed."""
    from simnpu.client.device import runtime

    stream = setup()
    event = value(acl.rt.create_event(), "create_event")
    empty = builtin("empty")
    rt = runtime()

    def sync_stream():
        launch_and_synchronize(empty, stream)

    def sync_event():
        check(launch(empty, 1, stream))
        check(acl.rt.record_event(event, stream))
        check(acl.rt.synchronize_event(event))

    def sync_device():
        check(launch(empty, 1, stream))
        check(acl.rt.synchronize_device())

    def query_stream():
        if value(acl.rt.stream_query(stream)) != acl.ACL_STREAM_STATUS_COMPLETE:
            raise SystemExit("stream query: not complete after its synchronize")

    def query_event():
        if value(acl.rt.query_event_status(event)) != acl.ACL_EVENT_RECORDED_STATUS_COMPLETE:
            raise SystemExit("event query: not complete after its synchronize")

    def completed():
        sync_event()  # the stream's last call: an event record, complete

    kinds = {  # name -> (untimed before, timed)
        "sync_stream": (None, sync_stream),
        "sync_event": (None, sync_event),
        "sync_device": (None, sync_device),
        "query_stream": (completed, query_stream),
        "query_event": (completed, query_event),
    }

    def measure(before, timed, count, by_request):
        if by_request:  # every call asks the daemon, as before the signals decided them
            rt.sync._deciding = lambda *contexts, **options: None
        samples = []
        try:
            for _ in range(count):
                if before is not None:
                    before()
                start = time.perf_counter()
                timed()
                samples.append(time.perf_counter() - start)
        finally:
            rt.sync.__dict__.pop("_deciding", None)
        return samples

    rounds, batch = int(rounds), int(batch)
    runs = [(name, by_request) for name in kinds for by_request in (False, True)]
    runs.remove(("sync_stream", True))
    samples: dict = {run: [] for run in runs}
    for run in runs:
        measure(*kinds[run[0]], 100, run[1])  # warm up
    while len(samples[runs[0]]) < rounds:
        for run in runs:
            samples[run] += measure(*kinds[run[0]], min(batch, rounds - len(samples[run])), run[1])
    result = {}
    for (name, by_request), figures in samples.items():
        p50, p99 = percentiles(figures)
        key = f"{name}_request" if by_request else name
        result[key] = {"p50": p50, "p99": p99}
    check(acl.rt.destroy_event(event))
    return result


OWN_EMPTY = """
from simnpu import kernel


@kernel()
def empty(ctx):
    pass
"""


def own_round_trip(rounds: str = "3000"):
    """A client's own empty kernel (it runs in the client's kernel process,
    docs/kernel-isolation.md): the first launch + synchronize, which forks that process,
    in ms; then launch + synchronize p50 and p99 in µs, as round_trip."""
    stream = setup()
    binary = value(acl.rt.binary_load_from_data(OWN_EMPTY.encode(), None), "binary_load")
    empty = value(acl.rt.binary_get_function(binary, "empty"), "binary_get_function")
    start = time.perf_counter()
    check(launch(empty, 1, stream), "launch")
    check(acl.rt.synchronize_stream(stream))
    first = time.perf_counter() - start
    samples = []
    for i in range(int(rounds) + 200):
        start = time.perf_counter()
        check(launch(empty, 1, stream))
        check(acl.rt.synchronize_stream(stream))
        if i >= 200:
            samples.append(time.perf_counter() - start)
    p50, p99 = percentiles(samples)
    return {"first_ms": first * 1e3, "p50": p50, "p99": p99}


def device_throughput(streams: str = "1", count: str = "50000"):
    """Tiny (empty) kernels completed per second over 1 or more streams."""
    setup()
    handles = [value(acl.rt.create_stream()) for _ in range(int(streams))]
    empty = builtin("empty")
    count = int(count)
    for stream in handles:
        check(launch(empty, 1, stream), "launch")
    check(acl.rt.synchronize_device())
    daemon_pid = int(os.environ.get("SIMNPU_BENCH_DAEMON_PID", "0"))  # bench/observe_bench.py
    daemon_cpu = _cpu_ns(daemon_pid) if daemon_pid else 0
    client_cpu = time.process_time_ns()
    start = time.perf_counter()
    failed = 0
    for i in range(count):
        if launch(empty, 1, handles[i % len(handles)]):
            failed += 1
    check(acl.rt.synchronize_device())
    rate = count / (time.perf_counter() - start)
    if failed:
        raise SystemExit(f"{failed} of {count} launches failed: {acl.get_recent_err_msg()}")
    result = {"rate": rate, "client_cpu_ns": time.process_time_ns() - client_cpu}
    if daemon_pid:
        result["daemon_cpu_ns"] = _cpu_ns(daemon_pid) - daemon_cpu
    return result


def _cpu_ns(pid: int) -> int:
    """User + system CPU of a process and its children (a daemon and its workers), from /proc."""
    ticks, total = os.sysconf("SC_CLK_TCK"), 0
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        pids.append(int(entry))
            except OSError:
                pass
    for entry in pids:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total * 1_000_000_000 // ticks


def copy_bandwidth(nbytes: str, memory: str):
    """Best-of-5 GB/s of synchronous H2D and D2H copies of `nbytes` from pinned or pageable
    memory."""
    nbytes = int(nbytes)
    setup()
    device = value(acl.rt.malloc(nbytes, acl.ACL_MEM_MALLOC_HUGE_FIRST))
    if memory == "pinned":
        host = value(acl.rt.malloc_host(nbytes))
    else:
        array = np.ones(nbytes, np.uint8)
        host = array.ctypes.data
    result = {}
    for name, dst, src, kind in (("h2d", device, host, H2D), ("d2h", host, device, D2H)):
        best = 0.0
        for _ in range(5):
            start = time.perf_counter()
            check(acl.rt.memcpy(dst, nbytes, src, nbytes, kind), name)
            best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
        result[name] = best
    if memory == "pinned":
        check(acl.rt.free_host(host))
    check(acl.rt.free(device))
    result["shared_memory"] = _uses_shared_memory()
    return result


def _uses_shared_memory():
    from simnpu.client.device import runtime

    return runtime().memory.uses_shared_memory


def _ufunc_call(kind: str, views: list):
    """The numpy call a kernel_rate kind stands for, on `views` (its input(s), then its output)."""
    if kind == "add":
        return lambda: np.add(views[0], views[1], out=views[2])
    return lambda: np.exp(views[0], out=views[1])


def _one_part(segment, offsets, first, count, kind, go, ends, rounds):
    """A process of `_parts_at_once`: `count` elements from element `first` of the buffers at
    `offsets` of `segment`, each round when `go` opens; puts its (start, end) times."""
    from simnpu.shm.region import Region

    device = Region.attach(segment)
    views = [np.frombuffer(device.map, np.float32, count, offset + first * 4) for offset in offsets]
    call = _ufunc_call(kind, views)
    for _ in range(rounds):
        go.wait()
        start = time.monotonic()
        call()
        ends.put((start, time.monotonic()))
    views.clear()
    device.close()


class _PartsAtOnce:
    """The machine's own limit for `parts` AI cores: `parts` numpy processes, each on its
    block's share of the same buffers, started together by a barrier as a launch's blocks
    start. Each `round()` is the time from the first start to the last end (seconds)."""

    def __init__(self, segment, offsets, elements, kind, parts, rounds):
        import multiprocessing

        spawn = multiprocessing.get_context("spawn")  # no fork of a process with a session
        self.go, self.ends, self.parts = spawn.Barrier(parts + 1), spawn.Queue(), parts
        share = elements // parts
        self.processes = [
            spawn.Process(
                target=_one_part,
                args=(
                    segment,
                    offsets,
                    i * share,
                    share if i < parts - 1 else elements - i * share,
                    kind,
                    self.go,
                    self.ends,
                    rounds,
                ),
            )  # fmt: skip
            for i in range(parts)
        ]
        for process in self.processes:
            process.start()

    def round(self) -> float:
        self.go.wait(60)
        times = [self.ends.get(timeout=60) for _ in range(self.parts)]
        return max(end for _, end in times) - min(start for start, _ in times)

    def close(self) -> None:
        for process in self.processes:
            process.join(60)


def kernel_rate(kind: str, elements: str = "16777216"):
    """add (GB/s, 3 arrays) or exp (Gelem/s) of float32 with numBlocks = AI cores, best of 6,
    and its limit: the same numpy call in this one process on the very same buffers (the
    daemon's device segment mapped here, SIMNPU_BENCH_DAEMON_PID), the two measured in turn
    so that the machine's drift hits both alike. Also, printed beside: as many numpy
    processes as AI cores, each on its block's share of the buffers at once."""
    from simnpu.client.device import runtime
    from simnpu.shm.addresses import split_device_address
    from simnpu.shm.region import Region

    elements = int(elements)
    stream = setup()
    cores = runtime().ai_cores
    buffers = [value(acl.rt.malloc(elements * 4, acl.ACL_MEM_MALLOC_HUGE_FIRST)) for _ in range(3)]
    for buffer in buffers:
        check(acl.rt.memset(buffer, elements * 4, 0, elements * 4))
    segment = f"/simnpu-{os.environ['SIMNPU_BENCH_DAEMON_PID']}-dev0"
    device = Region.attach(segment)
    offsets = [split_device_address(b)[1] for b in buffers]
    views = [np.frombuffer(device.map, np.float32, elements, offset) for offset in offsets]
    numpy_call = _ufunc_call(kind, views)
    if kind == "add":
        func = builtin("add_f32")
        args = struct_pack("<QQQI", *buffers, elements)
        amount = elements * 12 / 1e9
    else:
        func = builtin("exp_f32")
        args = struct_pack("<QQI", buffers[0], buffers[1], elements)
        amount = elements / 1e9
    best = limit = at_once = 0.0
    parts = _PartsAtOnce(segment, offsets, elements, kind, cores, rounds=6)
    try:
        for _ in range(6):  # each measured right after the one process's call, alike
            start = time.perf_counter()
            numpy_call()
            limit = max(limit, amount / (time.perf_counter() - start))
            start = time.perf_counter()
            check(launch(func, cores, stream, args))
            check(acl.rt.synchronize_stream(stream))
            best = max(best, amount / (time.perf_counter() - start))
            numpy_call()
            at_once = max(at_once, amount / parts.round())
    finally:
        parts.close()
    views.clear()  # no numpy view may keep the mapping open
    device.close()
    return {"rate": best, "limit": limit, "blocks": cores, "processes_at_once": at_once}


def struct_pack(layout, *values):
    import struct

    return struct.pack(layout, *values)


def pipeline(chunks: str = "12", chunk_bytes: str = str(16 << 20)):
    """Copy/compute pipeline: H2D copies on one stream, a compute-bound kernel (exp, 1 block)
    on another, ordered by events; against the same work on one stream. Returns both times."""
    chunks, chunk_bytes = int(chunks), int(chunk_bytes)
    setup()
    copy_stream, compute_stream = value(acl.rt.create_stream()), value(acl.rt.create_stream())
    host = value(acl.rt.malloc_host(chunks * chunk_bytes))
    inputs = [value(acl.rt.malloc(chunk_bytes, 0)) for _ in range(chunks)]
    outputs = [value(acl.rt.malloc(chunk_bytes, 0)) for _ in range(chunks)]
    events = [value(acl.rt.create_event()) for _ in range(chunks)]
    exp = builtin("exp_f32")
    elements = chunk_bytes // 4

    def run(copy_on, compute_on):
        start = time.perf_counter()
        for i in range(chunks):
            check(
                acl.rt.memcpy_async(
                    inputs[i], chunk_bytes, host + i * chunk_bytes, chunk_bytes, H2D, copy_on
                )
            )
            check(acl.rt.record_event(events[i], copy_on))
            check(acl.rt.stream_wait_event(compute_on, events[i]))
            check(launch(exp, 1, compute_on, struct_pack("<QQI", inputs[i], outputs[i], elements)))
        check(acl.rt.synchronize_device())
        return time.perf_counter() - start

    run(compute_stream, compute_stream)  # warm-up
    one = min(run(compute_stream, compute_stream) for _ in range(3))
    two = min(run(copy_stream, compute_stream) for _ in range(3))
    return {"one_stream_s": one, "two_streams_s": two}


def first_call():
    """Nothing to measure inside: the parent times this whole process (init + set_device)."""
    setup()
    return {}


def facade_overhead(calls: str = "1000000"):
    """ns per call that the acl facade adds to a body with launch_kernel_with_host_args's
    parameters ("kIkOkkOk"): the generated function simnpu uses, and the alternative without
    generated code -- one generic wrapper that walks the spec on every call. Both check the
    arguments, keep failures and shape the result the same way; no session is involved."""
    import struct
    import timeit

    from simnpu.client import facade
    from simnpu.proto.errors import NpuError

    spec = "kIkOkkOk"

    def body(rt, func, blocks, stream, config, args, size, reserve, more):
        return None

    def generic(body):
        def int_check(slow):
            return lambda value, position, name, param: (
                value if value.__class__ is int else slow(value, position, name, param)
            )

        letters = {"k": int_check(facade._k), "I": int_check(facade._i), "O": None}
        checks = [letters[letter] for letter in spec]
        name = body.__name__
        params = body.__code__.co_varnames[1 : 1 + len(spec)]

        def call(*args):
            args = list(args)
            for position, check in enumerate(checks):
                if check is not None:
                    args[position] = check(args[position], position + 1, name, params[position])
            try:
                body(None, *args)
            except NpuError as error:
                return facade.failed(error, name)
            except (OverflowError, struct.error) as error:
                return facade._out_of_range(error, name)
            return 0

        return call

    generated = facade.api(spec, needs_session=False)(body).generate()
    walked = generic(body)
    args = (1, 2, 3, None, 4, 5, None, 6)
    count = int(calls)

    def per_call(thunk) -> float:
        return min(timeit.repeat(thunk, number=count, repeat=5)) / count * 1e9

    bare = per_call(lambda: body(None, *args))  # the body alone, called the same way
    return {
        "generated_ns": per_call(lambda: generated(*args)) - bare,
        "generic_ns": per_call(lambda: walked(*args)) - bare,
    }


PROBES = {
    f.__name__: f
    for f in (
        launch_rate,
        round_trip,
        device_throughput,
        copy_bandwidth,
        kernel_rate,
        pipeline,
        first_call,
        facade_overhead,
        own_round_trip,
        signal_calls,
        malloc_pair,
    )
}

if __name__ == "__main__":
    result = PROBES[sys.argv[1]](*sys.argv[2:])
    if sys.argv[1] != "facade_overhead":  # the one probe without a session
        acl.rt.reset_device(0)
        acl.finalize()
    print(json.dumps(result))
