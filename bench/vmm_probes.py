"""The virtual-memory rows of bench/memory_bench.py (section 5): the VMM calls through the
`acl` facade, each beside the aclrtMalloc memory it stands in for, measured in the same run.

Every function here is a pyACL program against the daemon at SIMNPU_ADDRESS, run in this
process between `acl.init()` and `acl.finalize()` (`session`); sizes are parameters, so the
same code runs at full size in the benchmark and tiny in a smoke test.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import time
from collections.abc import Iterator

import acl
from simnpu.proto import codes

MiB = 1 << 20
PROP = {
    "handle_type": codes.ACL_MEM_HANDLE_TYPE_NONE,
    "allocation_type": codes.ACL_MEM_ALLOCATION_TYPE_PINNED,
    "mem_attr": codes.ACL_HBM_MEM_HUGE,
    "location": {"id": 0, "type": codes.ACL_MEM_LOCATION_TYPE_DEVICE},
    "reserve": 0,
}
HUGE_FIRST = codes.ACL_MEM_MALLOC_HUGE_FIRST
H2D = codes.ACL_MEMCPY_HOST_TO_DEVICE


def _check(ret: int, what: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed with {ret}: {acl.get_recent_err_msg()}")


def _value(result: tuple, what: str) -> int:
    value, ret = result
    _check(ret, what)
    return value


def _summary(samples: list[float]) -> dict:
    """p50 and p99 in µs of samples in seconds."""
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e6

    return {"p50_us": pick(0.5), "p99_us": pick(0.99)}


@contextlib.contextmanager
def session(address: str) -> Iterator[None]:
    """This process as a pyACL program of the daemon at `address`, device 0 set."""
    previous = os.environ.get("SIMNPU_ADDRESS")
    os.environ["SIMNPU_ADDRESS"] = address
    try:
        _check(acl.init(), "aclInit")
        _check(acl.rt.set_device(0), "aclrtSetDevice")
        try:
            yield
        finally:
            acl.rt.reset_device(0)
            acl.finalize()
    finally:
        if previous is None:
            del os.environ["SIMNPU_ADDRESS"]
        else:
            os.environ["SIMNPU_ADDRESS"] = previous


def _turn(round_: int, pair: list) -> list:
    """The two sides of a comparison in the order of this round: each goes first in turn."""
    return pair if round_ % 2 == 0 else pair[::-1]


class Mapped:
    """A reserved range of `chunks` x `chunk` bytes, each chunk a physical allocation mapped
    behind the one before (an expandable segment grown to its full size)."""

    def __init__(self, chunks: int, chunk: int):
        self.size = chunks * chunk
        self.base = _value(acl.rt.reserve_mem_address(self.size, 0, 0, 0), "reserve")
        self.handles = []
        for k in range(chunks):
            handle = _value(acl.rt.malloc_physical(chunk, PROP, 0), "malloc_physical")
            _check(acl.rt.map_mem(self.base + k * chunk, chunk, 0, handle, 0), "map_mem")
            self.handles.append((self.base + k * chunk, handle))

    def close(self) -> None:
        for address, handle in self.handles:
            _check(acl.rt.unmap_mem(address), "unmap_mem")
            _check(acl.rt.free_physical(handle), "free_physical")
        _check(acl.rt.release_mem_address(self.base), "release_mem_address")


def call_pairs(rounds: int, reserved: int = 1 << 30, size: int = 2 * MiB) -> dict:
    """p50/p99 (µs), interleaved round by round: aclrtReserveMemAddress + aclrtReleaseMemAddress
    of `reserved` bytes; aclrtMallocPhysical + aclrtMapMem + aclrtUnmapMem + aclrtFreePhysical
    of `size` bytes (each call too); and the baseline, aclrtMalloc + aclrtFree of `size` (the
    free returns before the daemon frees)."""
    clock = time.perf_counter
    names = ("reserve_release", "physical_cycle", "malloc_physical", "map", "unmap")
    names += ("free_physical", "malloc_free")
    samples: dict[str, list[float]] = {name: [] for name in names}
    base = _value(acl.rt.reserve_mem_address(reserved, 0, 0, 0), "reserve")
    for _ in range(rounds):
        start = clock()
        ptr = _value(acl.rt.reserve_mem_address(reserved, 0, 0, 0), "reserve")
        _check(acl.rt.release_mem_address(ptr), "release")
        t0 = clock()
        handle = _value(acl.rt.malloc_physical(size, PROP, 0), "malloc_physical")
        t1 = clock()
        _check(acl.rt.map_mem(base, size, 0, handle, 0), "map_mem")
        t2 = clock()
        _check(acl.rt.unmap_mem(base), "unmap_mem")
        t3 = clock()
        _check(acl.rt.free_physical(handle), "free_physical")
        t4 = clock()
        _check(acl.rt.free(_value(acl.rt.malloc(size, HUGE_FIRST), "malloc")), "free")
        t5 = clock()
        # aclrtFree returns before the daemon frees (and decommits): drain that, untimed, so
        # that the next round's first call does not wait behind it
        _check(acl.rt.synchronize_device(), "synchronize_device")
        for name, seconds in zip(
            names, (t0 - start, t4 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True
        ):
            samples[name].append(seconds)
    _check(acl.rt.synchronize_device(), "synchronize_device")
    _check(acl.rt.release_mem_address(base), "release")
    return {name: _summary(values) for name, values in samples.items()}


def growth(rounds: int, steps: int = 64, chunk: int = 2 * MiB, reserved: int = 1 << 30) -> dict:
    """An expandable segment growing: reserve `reserved` bytes, then `steps` times
    aclrtMallocPhysical of `chunk` + aclrtMapMem right behind the last chunk, each step timed;
    beside it, interleaved step by step, aclrtMalloc of `chunk` (kept, as the segment keeps
    its chunks). p50/p99 (µs) over `rounds` growths, and p50 of the last eighth of the steps."""
    clock = time.perf_counter
    steps_s: list[float] = []
    late_s: list[float] = []
    mallocs_s: list[float] = []
    for _ in range(rounds):
        base = _value(acl.rt.reserve_mem_address(reserved, 0, 0, 0), "reserve")
        mapped, kept = [], []
        for k in range(steps):
            start = clock()
            handle = _value(acl.rt.malloc_physical(chunk, PROP, 0), "malloc_physical")
            _check(acl.rt.map_mem(base + k * chunk, chunk, 0, handle, 0), "map_mem")
            middle = clock()
            kept.append(_value(acl.rt.malloc(chunk, HUGE_FIRST), "malloc"))
            mallocs_s.append(clock() - middle)
            steps_s.append(middle - start)
            if k >= steps - steps // 8:
                late_s.append(middle - start)
            mapped.append((base + k * chunk, handle))
        for address, handle in mapped:
            _check(acl.rt.unmap_mem(address), "unmap_mem")
            _check(acl.rt.free_physical(handle), "free_physical")
        _check(acl.rt.release_mem_address(base), "release")
        for ptr in kept:
            _check(acl.rt.free(ptr), "free")
        _check(acl.rt.synchronize_device(), "synchronize_device")
    return {
        "step": _summary(steps_s),
        "late_step": _summary(late_s),
        "malloc": _summary(mallocs_s),
    }


def h2d_bandwidth(rounds: int, chunks: int = 8, chunk: int = 32 * MiB) -> dict:
    """Best-of-`rounds` GB/s of an H2D copy of `chunks` x `chunk` bytes from pinned host
    memory into a range mapped from `chunks` physical allocations and into one aclrtMalloc
    buffer, both warm (each written once first), taken in turn (each first every other
    round): synchronous (the daemon copies) and asynchronous (the copy engines copy)."""
    size = chunks * chunk
    host = _value(acl.rt.malloc_host(size), "malloc_host")
    ctypes.memset(host, 1, size)
    stream = _value(acl.rt.create_stream(), "create_stream")
    mapped = Mapped(chunks, chunk)
    buffer = _value(acl.rt.malloc(size, HUGE_FIRST), "malloc")

    def sync(dst: int) -> None:
        _check(acl.rt.memcpy(dst, size, host, size, H2D), "memcpy")

    def asynchronous(dst: int) -> None:
        _check(acl.rt.memcpy_async(dst, size, host, size, H2D, stream), "memcpy_async")
        _check(acl.rt.synchronize_stream(stream), "synchronize_stream")

    best: dict[str, float] = {}
    try:
        for name, copy in (("sync", sync), ("async", asynchronous)):
            for dst in (mapped.base, buffer):  # warm: pages committed and in every page table
                copy(dst)
            for rnd in range(rounds):
                for where, dst in _turn(rnd, [("mapped", mapped.base), ("malloc", buffer)]):
                    start = time.perf_counter()
                    copy(dst)
                    rate = size / (time.perf_counter() - start) / 1e9
                    key = f"{name}_{where}_gbps"
                    best[key] = max(best.get(key, 0.0), rate)
    finally:
        _check(acl.rt.free(buffer), "free")
        mapped.close()
        _check(acl.rt.destroy_stream(stream), "destroy_stream")
        _check(acl.rt.free_host(host), "free_host")
    return best


def kernel_rate(rounds: int, size: int = 64 * MiB, chunk: int = 2 * MiB) -> dict:
    """Best-of-`rounds` GB/s (3 arrays moved) of the built-in add_f32 over arrays of `size`
    bytes, numBlocks = AI cores: the three side by side in one range mapped from chunks of
    `chunk` bytes, and in three aclrtMalloc buffers; both warm, taken in turn (each first
    every other round)."""
    from simnpu.client.device import runtime

    elements = size // 4
    stream = _value(acl.rt.create_stream(), "create_stream")
    func = _value(acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32"), "add_f32")
    mapped = Mapped(3 * size // chunk, chunk)
    buffers = [_value(acl.rt.malloc(size, HUGE_FIRST), "malloc") for _ in range(3)]
    arrays = {
        "mapped": [mapped.base + k * size for k in range(3)],
        "malloc": buffers,
    }
    blocks = runtime().ai_cores
    best: dict[str, float] = {}
    try:
        for where, pointers in arrays.items():
            for ptr in pointers:
                _check(acl.rt.memset(ptr, size, 0, size), "memset")
        packed = {
            where: ctypes.create_string_buffer(struct.pack("<QQQI", *pointers, elements))
            for where, pointers in arrays.items()
        }
        for rnd in range(rounds + 1):  # the first round warms the cores' page tables
            for where, args in _turn(rnd, list(packed.items())):
                start = time.perf_counter()
                _check(
                    acl.rt.launch_kernel_with_host_args(
                        func, blocks, stream, None, ctypes.addressof(args), len(args.raw)
                    ),
                    "launch",
                )
                _check(acl.rt.synchronize_stream(stream), "synchronize_stream")
                rate = 3 * size / (time.perf_counter() - start) / 1e9
                if rnd:
                    best[f"{where}_gbps"] = max(best.get(f"{where}_gbps", 0.0), rate)
    finally:
        for ptr in buffers:
            _check(acl.rt.free(ptr), "free")
        mapped.close()
        _check(acl.rt.destroy_stream(stream), "destroy_stream")
    best["blocks"] = blocks
    return best
