"""Device-memory benchmarks: the allocator in the daemon, trace replays, malloc/free end to end.

    python bench/memory_bench.py [--quick] [--only SECTION ...] [--json PATH]

1. Allocator: alloc+free pairs at 4,096 live blocks (free a random live block, allocate a
   new one; sizes log-uniform 512 B-256 KiB), each pair timed; p50 and p99. The naive
   first fit and the buddy allocator of bench/alloc_traces.py run the same sequence.
2. Trace replay (bench/alloc_traces.py, several seeds): peak address span / peak live
   requested bytes on a training-like trace, and the share of the region in use at the
   first out-of-memory on a trace whose batch size keeps growing; simnpu's allocator under
   NORMAL_ONLY and HUGE_FIRST, the first fit and the buddy beside it.
3. End to end: aclrtMalloc and aclrtFree through the client against a daemon started here,
   beside one ping-pong on an open gRPC bidi stream to a bare server (bench/baselines.py);
   the pair through acl (4 KiB and 2 MiB, bench/probes.py malloc_pair) beside launch +
   synchronize of an empty kernel, in alternate batches in the same process.
4. Devices at hardware scale (docs/device-memory.md): a daemon's start until its first
   client is served, and its PSS with its workers and /dev/shm use (idle, holding 1 GiB,
   after its free), for 1 x 2 GiB and 8 x 64 GiB; an H2D copy of 256 MiB into a fresh
   allocation vs into the same one again (warm), from pageable and from pinned memory;
   the daemon's malloc+free pair of a 64 MiB block (commit, decommit) beside a 4 KiB one.
5. Virtual memory (bench/vmm_probes.py, through acl), each beside aclrtMalloc memory in the
   same run: aclrtReserveMemAddress + aclrtReleaseMemAddress of 1 GiB and aclrtMallocPhysical
   + aclrtMapMem + aclrtUnmapMem + aclrtFreePhysical of 2 MiB, p50/p99, beside aclrtMalloc +
   aclrtFree of 2 MiB; an expandable segment growing by 64 chunks of 2 MiB, per step, beside
   aclrtMalloc of 2 MiB; H2D of 256 MiB into 8 mapped chunks of 32 MiB vs into one buffer;
   add_f32 over 64 MiB arrays in mapped chunks vs in buffers.

`--only` runs some sections: `core` (1. to 3.), `scale` (4.), `vmm` (5.).

Prints one table (targets from the issue; a missed target says MISS, nothing fails) and
writes JSON (default bench/results/memory.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import baselines  # noqa: E402
import vmm_probes  # noqa: E402
from alloc_traces import Buddy, FirstFit, dl_trace, replay, trace_summary  # noqa: E402
from run import Daemon, probe  # noqa: E402

from simnpu.client import autostart  # noqa: E402
from simnpu.proto import codes  # noqa: E402
from simnpu.shm.allocator import DeviceAllocator  # noqa: E402

NORMAL_ONLY = codes.ACL_MEM_MALLOC_NORMAL_ONLY
HUGE_FIRST = codes.ACL_MEM_MALLOC_HUGE_FIRST


def _percentile(sorted_samples, q):
    return sorted_samples[min(len(sorted_samples) - 1, int(len(sorted_samples) * q))]


# ---- 1. the allocator ---------------------------------------------------------------------------
def allocator_pairs(factory, live_blocks=4096, pairs=20000, seed=1, rounds=3) -> dict:
    """p50/p99 (µs) of one free + one allocate with `live_blocks` live; best round by p50."""
    best = None
    for _ in range(rounds):
        rng = random.Random(seed)
        allocator = factory(1 << 32)
        sizes = [
            int(math.exp(rng.uniform(math.log(512), math.log(256 << 10))))
            for _ in range(live_blocks + pairs)
        ]
        live = [allocator.allocate(s, NORMAL_ONLY).offset for s in sizes[:live_blocks]]
        victims = [rng.randrange(live_blocks) for _ in range(pairs)]
        clock = time.perf_counter_ns
        samples = [0] * pairs
        allocate, free = allocator.allocate, allocator.free
        for k in range(pairs):
            i = victims[k]
            size = sizes[live_blocks + k]
            start = clock()
            free(live[i])
            live[i] = allocate(size, NORMAL_ONLY).offset
            samples[k] = clock() - start
        samples.sort()
        result = {
            "p50_us": _percentile(samples, 0.5) / 1e3,
            "p99_us": _percentile(samples, 0.99) / 1e3,
        }
        if best is None or result["p50_us"] < best["p50_us"]:
            best = result
    return best


def timer_overhead_us(n=20000) -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        start = clock()
        samples.append(clock() - start)
    samples.sort()
    return _percentile(samples, 0.5) / 1e3


# ---- 2. traces -----------------------------------------------------------------------------------
def _paged(capacity: int) -> DeviceAllocator:
    """The allocator as the daemon's devices use it: every block owns whole 4 KiB pages."""
    return DeviceAllocator(capacity, align=4096)


ALLOCATORS = [
    ("simnpu best fit, NORMAL_ONLY", DeviceAllocator, NORMAL_ONLY),
    ("simnpu best fit, HUGE_FIRST", DeviceAllocator, HUGE_FIRST),
    ("simnpu as the daemon (4 KiB pages), NORMAL_ONLY", _paged, NORMAL_ONLY),
    ("simnpu as the daemon (4 KiB pages), HUGE_FIRST", _paged, HUGE_FIRST),
    ("naive first fit", FirstFit, NORMAL_ONLY),
    ("binary buddy", Buddy, NORMAL_ONLY),
]


def trace_figures(seeds: list[int], capacity: int) -> dict:
    out = {}
    for name, factory, policy in ALLOCATORS:
        spans, usable = [], []
        for seed in seeds:
            steady = replay(factory(1 << 44), dl_trace(seed), policy)
            spans.append(steady["span_ratio"])
            growing = replay(factory(capacity), dl_trace(seed, steps=60, grow=0.15), policy)
            if not growing["oom"]:
                raise SystemExit("the growing trace never ran out of memory: raise steps")
            usable.append(growing["live_at_oom"] / capacity)
        out[name] = {
            "span_ratio_max": max(spans),
            "span_ratio_mean": sum(spans) / len(spans),
            "usable_at_first_oom_min": min(usable),
            "usable_at_first_oom_mean": sum(usable) / len(usable),
        }
    return out


# ---- 3. end to end -------------------------------------------------------------------------------
def end_to_end(address: str, rounds: int, live_blocks: int = 4096) -> dict:
    """aclrtMalloc and aclrtFree through the raw client layer, with `live_blocks` blocks of
    this process live in the daemon."""
    from simnpu.client.runtime import Runtime

    rt = Runtime(address)
    try:
        rt.contexts.set_device(0)
        rng = random.Random(3)
        kept = [
            rt.memory.malloc(rng.randrange(512, 64 << 10), NORMAL_ONLY) for _ in range(live_blocks)
        ]
        for _ in range(200):
            rt.memory.free(rt.memory.malloc(4096, NORMAL_ONLY))
        mallocs, frees = [], []
        clock = time.perf_counter
        for _ in range(rounds):
            start = clock()
            ptr = rt.memory.malloc(4096, NORMAL_ONLY)
            middle = clock()
            rt.memory.free(ptr)
            mallocs.append(middle - start)
            frees.append(clock() - middle)
        rt.sync.synchronize_device()  # every free was accepted
        for ptr in kept:
            rt.memory.free(ptr)
        mallocs.sort()
        frees.sort()
        return {
            "malloc_p50_us": _percentile(mallocs, 0.5) * 1e6,
            "malloc_p99_us": _percentile(mallocs, 0.99) * 1e6,
            "free_p50_us": _percentile(frees, 0.5) * 1e6,
            "free_p99_us": _percentile(frees, 0.99) * 1e6,
        }
    finally:
        rt.close()


# ---- 4. devices at hardware scale ------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except OSError:
                continue
    return [p for child in children for p in (child, *_descendants(child))]


def _pss(pid: int) -> int:
    """Proportional set size of `pid` in bytes (shared pages split among their users)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _shm_used(pid: int) -> int:
    """Bytes of /dev/shm the segments of daemon `pid` hold."""
    prefix = f"simnpu-{pid}-"
    return sum(
        os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
        for name in os.listdir("/dev/shm")
        if name.startswith(prefix)
    )


def daemon_start(devices: int, memory: str) -> dict:
    """Seconds from the daemon's launch until a client's first malloc and free on device 0
    were served; then the PSS of the daemon and everything below it, and its /dev/shm use,
    with that client idle, holding 1 GiB (written) on the last device, and after its free."""
    from simnpu.client.runtime import Runtime

    with tempfile.TemporaryDirectory(prefix="simnpu-membench-") as directory:
        address = f"unix://{directory}/start.sock"
        start = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "simnpu.server", "--listen", address]
            + ["--devices", str(devices), "--memory", memory, "--log-level", "WARNING"]
        )
        try:
            while not autostart.reachable(address):
                if process.poll() is not None or time.monotonic() - start > 120:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.005)
            rt = Runtime(address)
            try:
                rt.contexts.set_device(0)
                rt.memory.free(rt.memory.malloc(4096))
                rt.sync.synchronize_device()
                served = time.monotonic() - start
                figures = {"first_client_s": served, **_footprint(process.pid, "idle")}
                rt.contexts.set_device(devices - 1)  # 1 GiB held on the last device, written
                held = rt.memory.malloc(1 << 30)
                rt.memory.memset(held, 1 << 30, 1, 1 << 30)
                figures.update(_footprint(process.pid, "holding_1GiB"))
                rt.memory.free(held)
                rt.sync.synchronize_device()
                figures.update(_footprint(process.pid, "freed"))
            finally:
                rt.close()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    return figures


def _footprint(pid: int, when: str) -> dict:
    """PSS of daemon `pid` and everything below it, and its /dev/shm use, in bytes."""
    return {
        f"pss_{when}": sum(_pss(p) for p in (pid, *_descendants(pid))),
        f"shm_{when}": _shm_used(pid),
    }


def first_touch(address: str, rounds: int, size: int = 256 << 20) -> dict:
    """Seconds of a 256 MiB H2D copy into a fresh allocation and into the same allocation
    again, best of `rounds` fresh allocations: synchronous from pageable memory (the
    daemon copies) and asynchronous from pinned memory (the copy engines copy); and the
    aclrtMalloc of the fresh one (its commit)."""
    import ctypes

    import numpy as np

    from simnpu.client.runtime import Runtime

    data = np.ones(size, np.uint8)
    rt = Runtime(address)
    times: dict[str, list[float]] = {}
    clock = time.perf_counter
    h2d = codes.ACL_MEMCPY_HOST_TO_DEVICE
    try:
        rt.contexts.set_device(0)
        pinned = rt.host.malloc_host(size)
        ctypes.memset(pinned, 1, size)
        stream = rt.streams.create_stream()

        def pageable(ptr: int) -> None:
            rt.memory.memcpy(ptr, size, data.ctypes.data, size, h2d)

        def from_pinned(ptr: int) -> None:
            rt.memory.memcpy_async(ptr, size, pinned, size, h2d, stream)
            rt.sync.synchronize_stream(stream)

        first = rt.memory.malloc(size)  # the engines map the pinned segment on its first use
        from_pinned(first)
        rt.memory.free(first)
        for _ in range(rounds):
            for name, copy in (("pageable", pageable), ("pinned", from_pinned)):
                start = clock()
                ptr = rt.memory.malloc(size)
                times.setdefault("malloc", []).append(clock() - start)
                for when in ("fresh", "warm"):
                    start = clock()
                    copy(ptr)
                    times.setdefault(f"{name}_{when}", []).append(clock() - start)
                rt.memory.free(ptr)
                rt.sync.synchronize_device()
        rt.streams.destroy_stream(stream)
        rt.host.free_host(pinned)
    finally:
        rt.close()
    return {f"{key}_s": min(values) for key, values in times.items()}


def ipc_exports(address: str, rounds: int, size: int = 64 << 20) -> dict:
    """Seconds, best of `rounds` fresh blocks of `size` bytes holding data: the block's first
    aclrtIpcMemGetExportKey (its pages move into a file of their own, docs/kernel-isolation.md),
    a second export of it (nothing moves), and the pageable H2D copy that filled it."""
    import numpy as np

    from simnpu.client.runtime import Runtime

    data = np.ones(size, np.uint8)
    rt = Runtime(address)
    times: dict[str, list[float]] = {}
    clock = time.perf_counter
    try:
        rt.contexts.set_device(0)
        for _ in range(rounds):
            ptr = rt.memory.malloc(size)
            keys = []
            start = clock()
            rt.memory.memcpy(ptr, size, data.ctypes.data, size, codes.ACL_MEMCPY_HOST_TO_DEVICE)
            times.setdefault("copy", []).append(clock() - start)
            for name in ("first", "again"):
                start = clock()
                keys.append(rt.memory.ipc_mem_get_export_key(ptr, size, 0))
                times.setdefault(name, []).append(clock() - start)
            for key in keys:
                rt.memory.ipc_mem_close(key)
            rt.memory.free(ptr)
            rt.sync.synchronize_device()
    finally:
        rt.close()
    return {f"{key}_s": min(values) for key, values in times.items()}


def device_pairs(size: int, pairs: int) -> dict:
    """p50 (µs) of DeviceWithMemory.allocate + free of `size` bytes in the daemon's own code
    (commit and, from 2 MiB free blocks, decommit included) on an otherwise empty 8 GiB
    device, one live 4 KiB block at its start."""
    from simnpu.server.memory.device_memory import DeviceWithMemory
    from simnpu.server.memory.host_memory import HostMemory

    device = DeviceWithMemory(0, 8 << 30, 1, 1, 0, HostMemory())
    samples = []
    clock = time.perf_counter_ns
    try:
        device.allocate(4096, NORMAL_ONLY, "other")
        for _ in range(pairs):
            start = clock()
            device.free(device.allocate(size, NORMAL_ONLY, "bench"))
            samples.append(clock() - start)
    finally:
        device.close()
    samples.sort()
    return {"p50_us": _percentile(samples, 0.5) / 1e3, "p99_us": _percentile(samples, 0.99) / 1e3}


def hardware_scale(table, quick: bool) -> dict:
    out: dict = {}
    for devices, memory in ((1, "2GiB"), (8, "64GiB")):
        figures = daemon_start(devices, memory)
        out[f"{devices}x{memory}"] = figures
        table.add(
            f"{devices} x {memory}: daemon start to first client served",
            figures["first_client_s"],
            "s",
            None,
            "< 2 s" if devices == 8 else "",
            figures["first_client_s"] < 2 if devices == 8 else None,
        )
        name = f"{devices} x {memory}"
        for when in ("idle", "holding_1GiB", "freed"):
            label = when.replace("_", " ")
            table.add(
                f"{name}: PSS, daemon + workers, {label}", figures[f"pss_{when}"] / 2**20, "MiB"
            )
            table.add(f"{name}: /dev/shm used, {label}", figures[f"shm_{when}"] / 2**20, "MiB")
    with tempfile.TemporaryDirectory(prefix="simnpu-membench-") as directory:
        daemon = Daemon(directory, "2GiB")
        try:
            touch = first_touch(daemon.address, 2 if quick else 4)
        finally:
            daemon.close()
    out["first_touch"] = touch
    for name, what in (("pageable", "pageable, synchronous"), ("pinned", "pinned, async")):
        fresh, warm = touch[f"{name}_fresh_s"], touch[f"{name}_warm_s"]
        target = name == "pageable"
        table.add(
            f"H2D 256 MiB ({what}) into a fresh allocation (vs warm)",
            fresh * 1e3,
            "ms",
            warm * 1e3,
            ">= 80% of warm" if target else "",
            warm / fresh >= 0.8 if target else None,
        )
    table.add("aclrtMalloc of 256 MiB (its commit)", touch["malloc_s"] * 1e3, "ms")
    small = device_pairs(4096, 2000 if quick else 10000)
    large = device_pairs(64 << 20, 20 if quick else 60)
    out["pairs"] = {"4KiB": small, "64MiB": large}
    table.add("daemon malloc+free 64 MiB p50 (vs 4 KiB)", large["p50_us"], "us", small["p50_us"])
    table.add("daemon malloc+free 4 KiB p99", small["p99_us"], "us")
    return out


# ---- 5. virtual memory --------------------------------------------------------------------------
def virtual_memory(table, quick: bool) -> dict:
    """Section 5 against a daemon of its own (one device of 2 GiB)."""
    with tempfile.TemporaryDirectory(prefix="simnpu-membench-") as directory:
        daemon = Daemon(directory, "2GiB")
        try:
            with vmm_probes.session(daemon.address):
                calls = vmm_probes.call_pairs(200 if quick else 500)
                grown = vmm_probes.growth(2 if quick else 3)
                copies = vmm_probes.h2d_bandwidth(3 if quick else 6)
                kernels = vmm_probes.kernel_rate(3 if quick else 8)
        finally:
            daemon.close()
    malloc_free = calls["malloc_free"]
    table.add(
        "reserve+release 1 GiB p50 (vs malloc+free 2 MiB)",
        calls["reserve_release"]["p50_us"],
        "us",
        malloc_free["p50_us"],
    )
    table.add(
        "reserve+release 1 GiB p99", calls["reserve_release"]["p99_us"], "us", malloc_free["p99_us"]
    )
    table.add(
        "MallocPhysical+Map+Unmap+FreePhysical 2 MiB p50 (vs same)",
        calls["physical_cycle"]["p50_us"],
        "us",
        malloc_free["p50_us"],
    )
    table.add(
        "MallocPhysical+Map+Unmap+FreePhysical 2 MiB p99",
        calls["physical_cycle"]["p99_us"],
        "us",
        malloc_free["p99_us"],
    )
    for name in ("malloc_physical", "map", "unmap", "free_physical"):
        table.add(f"  of which {name} p50", calls[name]["p50_us"], "us")
    table.add(
        "growth step MallocPhysical+Map 2 MiB p50 (vs malloc)",
        grown["step"]["p50_us"],
        "us",
        grown["malloc"]["p50_us"],
    )
    table.add(
        "growth step p50, last 8 of 64 steps (vs malloc)",
        grown["late_step"]["p50_us"],
        "us",
        grown["malloc"]["p50_us"],
    )
    for name in ("sync", "async"):
        table.add(
            f"H2D 256 MiB pinned {name}, 8 x 32 MiB mapped (vs buffer)",
            copies[f"{name}_mapped_gbps"],
            "GB/s",
            copies[f"{name}_malloc_gbps"],
        )
    table.add(
        "add_f32 on 64 MiB arrays, 2 MiB mapped chunks (vs buffers)",
        kernels["mapped_gbps"],
        "GB/s",
        kernels["malloc_gbps"],
    )
    return {"calls": calls, "growth": grown, "h2d": copies, "kernel": kernels}


# ---- the table -----------------------------------------------------------------------------------
class Table:
    def __init__(self):
        self.rows = []
        print(f"  {'what':<58} {'simnpu':>10} {'unit':<6} | {'baseline':>10}  {'ratio':>6}  target")

    def add(self, what, value, unit, baseline=None, target="", met=None):
        ratio = value / baseline if baseline else None
        self.rows.append(
            {
                "what": what,
                "value": value,
                "unit": unit,
                "baseline": baseline,
                "ratio": ratio,
                "target": target,
                "met": met,
            }
        )
        base = f"{baseline:>10.4g}" if baseline is not None else " " * 10
        rat = f"{ratio:>5.2f}x" if ratio is not None else " " * 6
        verdict = "" if met is None else ("ok  " if met else "MISS") + f" ({target})"
        print(f"  {what:<58} {value:>10.4g} {unit:<6} | {base}  {rat}  {verdict}", flush=True)


SECTIONS = ("core", "scale", "vmm")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and seeds")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "memory.json"))
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=SECTIONS,
        metavar="SECTION",
        help="core (1. to 3.), scale (4., devices at hardware scale), vmm (5., virtual memory)",
    )
    args = parser.parse_args(argv)
    table = Table()
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if "core" in args.only:
        allocator_and_end_to_end(table, results, args.quick)
    if "scale" in args.only:
        print("\n4. devices at hardware scale")
        results["hardware_scale"] = hardware_scale(table, args.quick)
    if "vmm" in args.only:
        print("\n5. virtual memory, through acl")
        results["virtual_memory"] = virtual_memory(table, args.quick)

    results["rows"] = table.rows
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    print(f"\nwrote {args.json}")
    return 0


def allocator_and_end_to_end(table: Table, results: dict, quick: bool) -> None:
    """Sections 1 to 3."""
    print("\n1. allocator, alloc+free pairs at 4096 live blocks (each pair timed)")
    pairs = 5000 if quick else 20000
    timer = timer_overhead_us()
    mine = allocator_pairs(DeviceAllocator, pairs=pairs)
    first = allocator_pairs(FirstFit, pairs=pairs, rounds=1)
    buddy = allocator_pairs(Buddy, pairs=pairs, rounds=1)
    results["allocator"] = {"simnpu": mine, "first_fit": first, "buddy": buddy, "timer_us": timer}
    table.add(
        "best fit: alloc+free pair p50 (vs naive first fit)",
        mine["p50_us"],
        "us",
        first["p50_us"],
        "<= 5 us",
        mine["p50_us"] <= 5.0,
    )
    table.add("best fit: alloc+free pair p99", mine["p99_us"], "us", first["p99_us"])
    table.add("binary buddy: alloc+free pair p50", buddy["p50_us"], "us")
    table.add("perf_counter_ns pair (included in each sample)", timer, "us")

    print("\n2. training-like trace replay (worst of the seeds)")
    seeds = [0, 1] if quick else [0, 1, 2, 3, 4]
    summary = trace_summary(dl_trace(seeds[0]))
    print(
        f"  trace (seed {seeds[0]}): {summary['allocations']} allocations of "
        f"{summary['smallest']} B to {summary['largest'] >> 20} MiB, lifetimes overlapping"
    )
    capacity = 8 << 30
    traces = trace_figures(seeds, capacity)
    results["traces"] = {
        "seeds": seeds,
        "oom_capacity": capacity,
        "summary": summary,
        "figures": traces,
    }
    for name, figures in traces.items():
        target = name.endswith("NORMAL_ONLY")
        table.add(
            f"{name}: peak span / peak live",
            figures["span_ratio_max"],
            "x",
            None,
            "<= 1.10" if target else "",
            figures["span_ratio_max"] <= 1.10 if target else None,
        )
        table.add(
            f"{name}: region in use at first OOM",
            figures["usable_at_first_oom_min"],
            "",
            None,
            ">= 0.90" if target else "",
            figures["usable_at_first_oom_min"] >= 0.90 if target else None,
        )

    print("\n3. end to end through the client (4096 of its blocks live)")
    rounds = 1000 if quick else 3000
    with tempfile.TemporaryDirectory(prefix="simnpu-membench-") as directory:
        bare = baselines.BareServer(directory)
        daemon = Daemon(directory, "1GiB")
        try:
            ping = baselines.ping_pong_us(bare.address, rounds)
            e2e = end_to_end(daemon.address, rounds)
            ping_again = baselines.ping_pong_us(bare.address, rounds)
            acl_pairs = {
                size: probe(
                    daemon.address, "malloc_pair", size, rounds // (1 if size < 1 << 20 else 6)
                )
                for size in (4096, 2 << 20)
            }
            exports = ipc_exports(daemon.address, 3 if quick else 7)
        finally:
            daemon.close()
            bare.close()
    ping_p50 = min(ping[0], ping_again[0])
    results["end_to_end"] = {
        **e2e,
        "ping_pong_p50_us": ping_p50,
        "ping_pong_p99_us": min(ping[1], ping_again[1]),
        "ping_pong_runs": [ping, ping_again],
    }
    table.add(
        "aclrtMalloc p50 (vs bare bidi ping-pong p50)",
        e2e["malloc_p50_us"],
        "us",
        ping_p50,
        "<= 1.2x",
        e2e["malloc_p50_us"] <= 1.2 * ping_p50,
    )
    table.add("aclrtMalloc p99", e2e["malloc_p99_us"], "us", min(ping[1], ping_again[1]))
    table.add(
        "aclrtFree p50 (returns before the daemon frees)",
        e2e["free_p50_us"],
        "us",
        ping_p50,
        "<= 1.2x",
        e2e["free_p50_us"] <= 1.2 * ping_p50,
    )
    table.add("aclrtFree p99", e2e["free_p99_us"], "us", min(ping[1], ping_again[1]))
    results["acl_pairs"] = acl_pairs
    small, large = acl_pairs[4096], acl_pairs[2 << 20]
    table.add(
        "aclrtMalloc + aclrtFree 4 KiB via acl p50 (vs launch + synchronize p50, same run)",
        small["p50"],
        "us",
        small["launch_p50"],
        "<= 2x",
        small["p50"] <= 2 * small["launch_p50"],
    )
    table.add("aclrtMalloc + aclrtFree 4 KiB via acl p99", small["p99"], "us", small["launch_p99"])
    table.add(
        "aclrtMalloc + aclrtFree 2 MiB via acl p50 (commits its pages)",
        large["p50"],
        "us",
        large["launch_p50"],
    )
    results["ipc_exports"] = exports
    table.add(
        "aclrtIpcMemGetExportKey, a 64 MiB block's first (moves its pages; vs its H2D fill)",
        exports["first_s"] * 1e3,
        "ms",
        exports["copy_s"] * 1e3,
    )
    table.add(
        "aclrtIpcMemGetExportKey, the same block again (moves nothing)",
        exports["again_s"] * 1e3,
        "ms",
        ping_p50 / 1e3,
    )


if __name__ == "__main__":
    sys.exit(main())
