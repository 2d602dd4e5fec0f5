"""Copies and memsets against a real daemon: every memcpy kind and ACL_MEMCPY_DEFAULT,
synchronous and asynchronous, from and to pinned (aclrtMallocHost) and pageable (numpy)
host memory, at sizes that cross the staging chunking, at offsets inside allocations;
stream order of asynchronous copies with kernels; memsets; memory info; edge cases.
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest
from conftest import GATE as SHARED_GATE
from conftest import run_client

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

MiB = 1 << 20
SIZES = [1, 4097, 3 * MiB + 5, 20 * MiB]  # 20 MiB takes several staging chunks (checked below)
OFFSET = 67  # copies start this far inside their allocations (and host buffers)
GUARD = 0xA5  # what surrounds every copied range; must survive the copy
LIMIT_S = 20.0

H2D, D2H, D2D, H2H = (
    codes.ACL_MEMCPY_HOST_TO_DEVICE,
    codes.ACL_MEMCPY_DEVICE_TO_HOST,
    codes.ACL_MEMCPY_DEVICE_TO_DEVICE,
    codes.ACL_MEMCPY_HOST_TO_HOST,
)
DEFAULT = codes.ACL_MEMCPY_DEFAULT

GATE = (
    SHARED_GATE
    + """

@kernel("ptr", "u32", "u8", "f64")
def slow_fill_bytes(ctx, x, n, value, seconds):
    time.sleep(seconds)
    ctx.gm(x, "uint8", n)[:] = value
"""
)


@pytest.fixture
def rt(npu, daemon, request, monkeypatch):
    """The runtime, on device 0. Parametrized "in-stream": as a client that cannot map the
    daemon's shared memory, whose copies carry their bytes in the gRPC stream."""
    if getattr(request, "param", "shm") == "in-stream":
        monkeypatch.setenv("SIMNPU_NO_SHM", "1")
        npu.shutdown()
        npu.connect(daemon.address)
        assert not npu.runtime().memory.uses_shared_memory
    with npu.Device(0):
        yield npu.runtime()


TRANSPORTS = pytest.mark.parametrize("rt", ["shm", "in-stream"], indirect=True)


def host_view(address: int, size: int) -> np.ndarray:
    """A numpy uint8 view of host memory at `address` (as pyACL users do with ctypes)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))


class HostBuffer:
    """`size` bytes of host memory with OFFSET guard bytes either side: pinned or pageable."""

    def __init__(self, rt, kind: str, size: int):
        self.rt, self.kind, self.size = rt, kind, size
        total = size + 2 * OFFSET
        if kind == "pinned":
            self.base = rt.host.malloc_host(total)
            self.whole = host_view(self.base, total)
        else:
            self.array = np.empty(total, np.uint8)
            self.base = self.array.ctypes.data
            self.whole = self.array
        self.whole[:] = GUARD
        self.address = self.base + OFFSET

    @property
    def data(self) -> np.ndarray:
        return self.whole[OFFSET : OFFSET + self.size]

    def guards_intact(self) -> bool:
        return bool(
            (self.whole[:OFFSET] == GUARD).all()
            and (self.whole[OFFSET + self.size :] == GUARD).all()
        )

    def free(self) -> None:
        del self.whole
        if self.kind == "pinned":
            self.rt.host.free_host(self.base)


class DeviceRange:
    """`size` bytes at OFFSET inside a device allocation whose other bytes are GUARD."""

    def __init__(self, rt, size: int):
        self.rt, self.size = rt, size
        self.total = size + 2 * OFFSET
        self.base = rt.memory.malloc(self.total)
        rt.memory.memset(self.base, self.total, GUARD, self.total)
        self.address = self.base + OFFSET

    def read_all(self) -> np.ndarray:
        out = np.empty(self.total, np.uint8)
        self.rt.memory.memcpy(out.ctypes.data, out.nbytes, self.base, self.total, D2H)
        return out

    def check(self, expected: np.ndarray) -> None:
        whole = self.read_all()
        assert (whole[:OFFSET] == GUARD).all() and (whole[OFFSET + self.size :] == GUARD).all(), (
            "a copy wrote outside its range"
        )
        np.testing.assert_array_equal(whole[OFFSET : OFFSET + self.size], expected)

    def free(self) -> None:
        self.rt.memory.free(self.base)


def random_bytes(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + size).integers(0, 256, size, dtype=np.uint8)


# ---- the four kinds and DEFAULT, every size, pinned and pageable, sync and async -----------------


@pytest.mark.parametrize("size", SIZES, ids=["1B", "4097B", "3MiB+5", "20MiB"])
@pytest.mark.parametrize("host", ["pinned", "pageable"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@TRANSPORTS
def test_round_trip_every_kind(rt, size, host, mode):
    """host -> device -> device -> host, then host -> host, with explicit kinds."""
    if size == max(SIZES):  # a pageable copy of it goes through the staging area in chunks
        assert size > rt.memory.copies.slot
    data = random_bytes(size)
    source, target = HostBuffer(rt, host, size), HostBuffer(rt, host, size)
    first, second = DeviceRange(rt, size), DeviceRange(rt, size)
    source.data[:] = data
    stream = rt.streams.create_stream() if mode == "async" else None

    def copy(dst, dest_max, src, count, kind):
        if stream is None:
            rt.memory.memcpy(dst, dest_max, src, count, kind)
        else:
            rt.memory.memcpy_async(dst, dest_max, src, count, kind, stream)

    copy(first.address, size + OFFSET, source.address, size, H2D)
    copy(second.address, size + OFFSET, first.address, size, D2D)
    copy(target.address, size + OFFSET, second.address, size, D2H)
    if stream is not None:
        rt.sync.synchronize_stream(stream)
    np.testing.assert_array_equal(target.data, data)
    assert target.guards_intact()
    first.check(data)
    second.check(data)
    target.data[:] = 0
    rt.memory.memcpy(target.address, size, source.address, size, H2H)
    np.testing.assert_array_equal(target.data, data)
    assert target.guards_intact()
    if stream is not None:
        rt.streams.destroy_stream(stream)
    for buffer in (source, target, first, second):
        buffer.free()


@pytest.mark.parametrize("size", [4097, 20 * MiB], ids=["4097B", "20MiB"])
@pytest.mark.parametrize("host", ["pinned", "pageable"])
@pytest.mark.parametrize("mode", ["sync", "async"])
@TRANSPORTS
def test_default_kind_takes_the_direction_from_the_addresses(rt, size, host, mode):
    data = random_bytes(size, seed=1)
    source, target = HostBuffer(rt, host, size), HostBuffer(rt, host, size)
    first, second = DeviceRange(rt, size), DeviceRange(rt, size)
    assert first.address >= 2**47 and source.address < 2**47
    source.data[:] = data
    stream = rt.streams.create_stream() if mode == "async" else None
    for dst, src in ((first, source), (second, first), (target, second)):
        if stream is None:
            rt.memory.memcpy(dst.address, size, src.address, size, DEFAULT)
        else:
            rt.memory.memcpy_async(dst.address, size, src.address, size, DEFAULT, stream)
    if stream is not None:
        rt.sync.synchronize_stream(stream)
        rt.streams.destroy_stream(stream)
    np.testing.assert_array_equal(target.data, data)
    assert target.guards_intact()
    second.check(data)
    target.data[:] = 0
    rt.memory.memcpy(target.address, size, source.address, size, DEFAULT)  # host -> host
    np.testing.assert_array_equal(target.data, data)
    for buffer in (source, target, first, second):
        buffer.free()


def test_kind_must_match_the_pointers(rt):
    host = np.zeros(64, np.uint8)
    device = rt.memory.malloc(64)
    for dst, src, kind in (
        (device, host.ctypes.data, D2H),
        (host.ctypes.data, device, H2D),
        (device, host.ctypes.data, D2D),
        (host.ctypes.data, device, H2H),
    ):
        with pytest.raises(NpuError) as info:
            rt.memory.memcpy(dst, 64, src, 64, kind)
        assert info.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    rt.memory.free(device)


# ---- stream order -------------------------------------------------------------------------------


def test_async_pinned_copies_are_stream_ordered_with_kernels(npu, rt):
    n = 1 << 16
    stream = npu.Stream()
    pinned = npu.PinnedBuffer(4 * n)
    values = pinned.array(np.float32)
    values[:] = np.linspace(-4, 4, n, dtype=np.float32)
    x, y = npu.DeviceBuffer(4 * n), npu.DeviceBuffer(4 * n)
    relu, add = npu.builtin("relu_f32"), npu.builtin("add_f32")
    for _ in range(
        3
    ):  # copy -> kernels -> copy back, several times, never synchronizing in between
        rt.memory.memcpy_async(x.ptr, x.nbytes, pinned.ptr, pinned.nbytes, H2D, stream.handle)
        relu.launch(5, x, y, n, stream=stream)
        add.launch(2, y, y, x, n, stream=stream)
        rt.memory.memcpy_async(pinned.ptr, pinned.nbytes, x.ptr, x.nbytes, D2H, stream.handle)
    stream.synchronize()
    expected = np.linspace(-4, 4, n, dtype=np.float32)
    for _ in range(3):
        expected = np.maximum(expected, 0) * 2
    np.testing.assert_array_equal(values, expected)
    del values
    pinned.free()


def test_async_pinned_copy_returns_before_the_stream_reaches_it(npu, rt):
    """Behind a closed gate, a pinned memcpy_async must return at once and not have run."""
    gate = npu.Module.from_source(GATE, "gate.py").function("gate")
    flag = npu.DeviceBuffer(4)
    flag.fill(0)
    size = 3 * MiB + 5
    stream = npu.Stream()
    pinned_in, pinned_out = npu.PinnedBuffer(size), npu.PinnedBuffer(size)
    data = random_bytes(size, seed=2)
    pinned_in.array()[:] = data
    pinned_out.array()[:] = 0
    device = npu.DeviceBuffer(size)
    gate.launch(1, flag, LIMIT_S, stream=stream)
    rt.memory.memcpy_async(device.ptr, size, pinned_in.ptr, size, H2D, stream.handle)
    rt.memory.memcpy_async(pinned_out.ptr, size, device.ptr, size, D2H, stream.handle)
    assert not stream.query()
    assert not pinned_out.array().any(), "the device-to-host copy ran before the gate opened"
    rt.memory.memset(flag.ptr, 4, 1, 4)  # open the gate
    stream.synchronize()
    np.testing.assert_array_equal(pinned_out.array(), data)
    pinned_in.free()
    pinned_out.free()


def test_sync_memcpy_is_not_stream_ordered_but_is_right_after_synchronize(npu, rt):
    """The classic pitfall: reading results with aclrtMemcpy right after a launch may
    see stale data (not asserted: it depends on timing). After synchronize it is right."""
    kernel = npu.Module.from_source(GATE, "gate.py").function("slow_fill_bytes")
    n = 4096
    stream = npu.Stream()
    device = npu.DeviceBuffer(n)
    device.fill(0)
    kernel.launch(1, device, n, 7, 0.1, stream=stream)
    early = device.to_numpy()  # may or may not be filled yet
    assert set(np.unique(early)) <= {0, 7}
    stream.synchronize()
    assert (device.to_numpy() == 7).all()


def test_to_numpy_returns_an_array_of_bytes_without_a_dtype(npu, rt):
    buffer = npu.DeviceBuffer.from_array(np.arange(10, dtype=np.uint8))
    raw = buffer.to_numpy()
    assert isinstance(raw, np.ndarray) and raw.dtype == np.uint8 and raw.shape == (10,)
    np.testing.assert_array_equal(raw, np.arange(10))
    assert buffer.to_numpy(np.int32).shape == (2,)  # whole elements only
    assert buffer.to_numpy(np.uint8, (2, 5)).tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    buffer.free()


# ---- memset --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4097, 3 * MiB + 5], ids=["1B", "4097B", "3MiB+5"])
def test_memset_device(npu, rt, size):
    target = DeviceRange(rt, size)
    rt.memory.memset(target.address, size + OFFSET, 0x3C, size)
    target.check(np.full(size, 0x3C, np.uint8))
    stream = npu.Stream()
    rt.memory.memset_async(
        target.address, size + OFFSET, 0x1FF, size, stream.handle
    )  # only the low byte counts
    stream.synchronize()
    target.check(np.full(size, 0xFF, np.uint8))
    target.free()


@pytest.mark.parametrize("host", ["pinned", "pageable"])
def test_memset_host(npu, rt, host):
    size = 4097
    buffer = HostBuffer(rt, host, size)
    rt.memory.memset(buffer.address, size, 0x42, size)
    assert (buffer.data == 0x42).all() and buffer.guards_intact()
    stream = npu.Stream()
    rt.memory.memset_async(buffer.address, size, 0x24, size, stream.handle)
    stream.synchronize()
    assert (buffer.data == 0x24).all() and buffer.guards_intact()
    buffer.free()


def test_memset_async_of_pinned_memory_is_stream_ordered(npu, rt):
    """gate; device -> pinned copy; memset of that pinned memory: the memset comes last."""
    gate = npu.Module.from_source(GATE, "gate.py").function("gate")
    flag = npu.DeviceBuffer(4)
    flag.fill(0)
    size = 4097
    device = npu.DeviceBuffer(size)
    device.fill(0x11)
    pinned = npu.PinnedBuffer(size)
    pinned.array()[:] = 0
    stream = npu.Stream()
    gate.launch(1, flag, LIMIT_S, stream=stream)
    rt.memory.memcpy_async(pinned.ptr, size, device.ptr, size, D2H, stream.handle)
    rt.memory.memset_async(pinned.ptr, size, 0x22, size, stream.handle)
    rt.memory.memset(flag.ptr, 4, 1, 4)
    stream.synchronize()
    assert (pinned.array() == 0x22).all(), "memset_async of pinned memory ran out of stream order"
    pinned.free()


# ---- memory info and edge cases ------------------------------------------------------------------


def test_mem_info_follows_malloc_and_free(rt):
    free_at_start, total = rt.memory.get_mem_info()
    assert total == 256 * MiB  # the fixture's --memory
    assert 0 < free_at_start <= total
    size = 5 * MiB + 3
    address = rt.memory.malloc(size)
    free_allocated, total_allocated = rt.memory.get_mem_info()
    assert total_allocated == total
    rt.memory.free(address)
    free_after, _ = rt.memory.get_mem_info()
    # Another client's memory may be released meanwhile, which only adds to `free`.
    assert free_after - free_allocated >= size
    assert free_allocated <= total - size


def test_count_zero_is_a_no_op(npu, rt):
    host = np.full(16, 9, np.uint8)
    device = rt.memory.malloc(16)
    rt.memory.memset(device, 16, 3, 16)
    stream = npu.Stream()
    rt.memory.memcpy(device, 16, host.ctypes.data, 0, H2D)
    rt.memory.memcpy(host.ctypes.data, 16, device, 0, D2H)
    rt.memory.memcpy_async(device, 16, host.ctypes.data, 0, H2D, stream.handle)
    rt.memory.memcpy_async(host.ctypes.data, 16, host.ctypes.data, 0, H2H, stream.handle)
    rt.memory.memset(device, 16, 0, 0)
    rt.memory.memset_async(host.ctypes.data, 16, 0, 0, stream.handle)
    stream.synchronize()
    assert (host == 9).all()
    out = np.empty(16, np.uint8)
    rt.memory.memcpy(out.ctypes.data, 16, device, 16, D2H)
    assert (out == 3).all()
    rt.memory.free(device)


def test_host_to_host(npu, rt):
    source = random_bytes(4097, seed=3)
    pageable = np.zeros_like(source)
    pinned = npu.PinnedBuffer(source.nbytes)
    rt.memory.memcpy(pinned.ptr, pinned.nbytes, source.ctypes.data, source.nbytes, H2H)
    rt.memory.memcpy(pageable.ctypes.data, pageable.nbytes, pinned.ptr, pinned.nbytes, H2H)
    np.testing.assert_array_equal(pageable, source)
    stream = npu.Stream()
    for dst, src in ((pageable.ctypes.data, source.ctypes.data), (pinned.ptr, source.ctypes.data)):
        for kind in (H2H, DEFAULT):
            with pytest.raises(NpuError) as info:
                rt.memory.memcpy_async(dst, source.nbytes, src, source.nbytes, kind, stream.handle)
            assert info.value.code == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT == 207000
    pinned.free()


def test_pinned_memory_is_usable_through_ctypes_at_its_address(rt):
    size = 4096
    address = rt.host.malloc_host(size)
    view = host_view(address, size)
    view[:] = np.arange(size) % 251
    ctypes.memmove(address, b"simnpu", 6)
    assert bytes(view[:6]) == b"simnpu"
    device = rt.memory.malloc(size)
    rt.memory.memcpy(device, size, address, size, H2D)
    back = np.zeros(size, np.uint8)
    rt.memory.memcpy(back.ctypes.data, size, device, size, D2H)
    np.testing.assert_array_equal(back, view)
    del view
    rt.memory.free(device)
    rt.host.free_host(address)


@TRANSPORTS
def test_large_async_copies_of_two_streams_do_not_mix(npu, rt):
    """Two threads copy 20 MiB each, on their own streams, through the one staging area."""
    size = 20 * MiB
    data = [random_bytes(size, seed=s) for s in (4, 5)]
    streams = [npu.Stream(), npu.Stream()]
    devices = [npu.DeviceBuffer(size) for _ in streams]
    outs = [np.zeros(size, np.uint8) for _ in streams]

    def run(index):
        stream, device = streams[index], devices[index]
        device.copy_from_host(data[index], stream=stream)
        device.copy_to_host(outs[index], stream=stream)
        stream.synchronize()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads)
    for index in range(2):
        np.testing.assert_array_equal(outs[index], data[index])


# ---- bad host pointers ---------------------------------------------------------------------------
BAD_HOST_POINTERS = """
import ctypes
import mmap

import numpy as np

import acl
import simnpu.client as npu
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

assert acl.init() == 0 and acl.rt.set_device(0) == 0
dev, ret = acl.rt.malloc(4096, 0)
stream, ret = acl.rt.create_stream()
host = np.zeros(4096, np.uint8)

# Four pages of one mapping, made after the session's threads (whose malloc arenas reserve
# address space): read-write, unmapped, read-only, read-write. The hole lies
# between pages of ours, so nothing this process maps later takes it but a lone page.
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
]
libc.munmap.argtypes = libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
base = libc.mmap(
    None, 4 * PAGE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0
)
assert base and base != 2**64 - 1, ctypes.get_errno()
gone, read_only = base + PAGE, base + 2 * PAGE
assert libc.munmap(gone, PAGE, 0) == 0
assert libc.mprotect(read_only, PAGE, mmap.PROT_READ) == 0
straddling = base + PAGE // 2  # from a good page into the hole

N = PAGE
UNMAPPED = "are not mapped in this process"
# a read-only page is mapped: refusing it as a destination would take a check per page, which
# costs as much as the copy (client/hostmem.py); reading it is fine
sources = destinations = {0x1234: UNMAPPED, gone: UNMAPPED, straddling: UNMAPPED}


def refused(ret, param, address, why):
    message = acl.get_recent_err_msg()
    assert ret == codes.ACL_ERROR_RT_PARAM_INVALID, (ret, message)
    assert f"{param} {address:#x}: the {N} bytes of host memory there {why}" in message, message


H2D, D2H, H2H = (
    acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_MEMCPY_DEVICE_TO_HOST, acl.ACL_MEMCPY_HOST_TO_HOST
)
for address, why in sources.items():
    refused(acl.rt.memcpy(dev, N, address, N, H2D), "src", address, why)
    refused(acl.rt.memcpy_async(dev, N, address, N, H2D, stream), "src", address, why)
    refused(acl.rt.memcpy(host.ctypes.data, N, address, N, H2H), "src", address, why)
for address, why in destinations.items():
    refused(acl.rt.memcpy(address, N, dev, N, D2H), "dst", address, why)
    refused(acl.rt.memcpy_async(address, N, dev, N, D2H, stream), "dst", address, why)
    refused(acl.rt.memcpy(address, N, host.ctypes.data, N, H2H), "dst", address, why)
    refused(acl.rt.memset(address, N, 0, N), "devPtr", address, why)
    refused(acl.rt.memset_async(address, N, 0, N, stream), "devPtr", address, why)
assert acl.rt.memcpy(dev, N, read_only, N, H2D) == 0  # reading a read-only mapping is fine
assert acl.rt.synchronize_stream(stream) == 0

data = (np.arange(N) % 251).astype(np.uint8)  # the session still works
assert acl.rt.memcpy(dev, N, data.ctypes.data, N, H2D) == 0
assert acl.rt.memcpy(host.ctypes.data, N, dev, N, D2H) == 0
assert (host == data).all()

buffer = npu.DeviceBuffer.from_array(data)  # the Pythonic API, on arrays over bad memory
for call, param, address, why in (
    (buffer.copy_to_host, "dst", straddling, UNMAPPED),
    (buffer.copy_from_host, "src", gone, UNMAPPED),
):
    array = np.ctypeslib.as_array((ctypes.c_uint8 * N).from_address(address))
    try:
        call(array)
    except NpuError as error:
        assert error.code == codes.ACL_ERROR_RT_PARAM_INVALID, error
        assert f"{param} {address:#x}: the {N} bytes of host memory there {why}" in error.message
    else:
        raise AssertionError(f"{call.__name__} of bad host memory did not fail")
np.testing.assert_array_equal(buffer.to_numpy(), data)
buffer.free()

assert acl.rt.destroy_stream(stream) == 0 and acl.rt.free(dev) == 0
assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
print("ok")
"""


@pytest.mark.parametrize("transport", ["shm", "in-stream"])
def test_bad_host_pointers_are_refused_and_the_session_goes_on(daemon, transport):
    """Unmapped host memory (as source, destination, memset target; sync and async, acl and
    Pythonic) is 107000 naming the parameter and the pointer, where
    touching it would have crashed the process: run in a process of its own."""
    env = {"SIMNPU_NO_SHM": "1"} if transport == "in-stream" else {}
    result = run_client(daemon.address, BAD_HOST_POINTERS, env=env)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr}"
    assert result.stdout.strip() == "ok", result.stderr
