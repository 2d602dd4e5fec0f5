"""Registered host memory against a real daemon: pinned memory reached by kernels, copies and
memsets through its device pointer, without copies; the codes for bad input; another
client's kernels and calls cannot reach it; the session's end leaves nothing behind."""

from __future__ import annotations

import ctypes
import signal
import struct
import time

import numpy as np
import pytest
from conftest import run_client, simnpu_segments, start_client

from simnpu.proto import codes

KERNELS = """
from simnpu import kernel

@kernel("ptr", "ptr", "ptr", "u64")
def add(ctx, x, y, z, n):
    share = -(-n // ctx.block_num)
    start = ctx.block_idx * share
    count = max(0, min(n, start + share) - start)
    if count:
        out = ctx.gm(z + 2 * start, "float16", count, "w")
        out[:] = ctx.gm(x + 2 * start, "float16", count, "r") + ctx.gm(
            y + 2 * start, "float16", count, "r"
        )

@kernel("ptr", "u64")
def bump(ctx, x, n):
    ctx.gm(x, "int32", n)[:] += 1
"""
H2D, D2H = codes.ACL_MEMCPY_HOST_TO_DEVICE, codes.ACL_MEMCPY_DEVICE_TO_HOST
INVALID = codes.ACL_ERROR_INVALID_PARAM
PARAM = codes.ACL_ERROR_RT_PARAM_INVALID


def host_array(address: int, count: int, dtype) -> np.ndarray:
    size = count * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_char * size).from_address(address), dtype, count)


def launch(acl, function, stream, blocks: int, *values: int) -> int:
    args = struct.pack(f"<{len(values)}Q", *values)
    return acl.rt.launch_kernel_with_host_args(
        function, blocks, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )


def test_kernels_read_and_write_registered_pinned_memory(acl):
    n = 8 * 2048
    binary, ret = acl.rt.binary_load_from_data(KERNELS.encode(), None)
    add, _ = acl.rt.binary_get_function(binary, "add")
    stream, _ = acl.rt.create_stream()
    hosts, devs = [], []
    for _ in range(3):
        host, ret = acl.rt.malloc_host(2 * n)
        assert ret == 0
        assert acl.rt.host_register_v2(host, 2 * n, codes.ACL_HOST_REG_MAPPED) == 0
        dev, ret = acl.rt.host_get_device_pointer(host, 0)
        assert ret == 0 and dev and dev != host
        hosts.append(host)
        devs.append(dev)
    x, y, z = (host_array(h, n, np.float16) for h in hosts)
    x[:] = np.arange(n) % 512
    y[:] = 0.5
    z[:] = 0
    assert launch(acl, add, stream, 8, *devs, n) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(z, (x + y).astype(np.float16))  # bit for bit, read in place
    # the host sees the kernel's writes and the kernel the host's, without copies
    x[:] = 3
    assert launch(acl, add, stream, 8, *devs, n) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert (z == np.float16(3.5)).all()
    # copies and memsets reach the same bytes through the device pointer
    data = np.full(n, 7, np.float16)
    assert acl.rt.memcpy(devs[0], 2 * n, data.ctypes.data, 2 * n, H2D) == 0
    assert (x == 7).all()
    assert acl.rt.memset(devs[2], 2 * n, 0, 2 * n) == 0
    assert (z == 0).all()
    out = np.zeros(n, np.float16)
    assert acl.rt.memcpy(out.ctypes.data, 2 * n, devs[1], 2 * n, D2H) == 0
    assert (out == np.float16(0.5)).all()
    for host in hosts:
        assert acl.rt.host_unregister(host) == 0
        assert acl.rt.free_host(host) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.binary_unload(binary) == 0


def test_a_sub_range_and_host_register_v1(acl):
    host, _ = acl.rt.malloc_host(3 * 4096)
    dev, ret = acl.rt.host_register(host + 4100, 8000, codes.ACL_HOST_REGISTER_MAPPED)
    assert ret == 0 and dev % 4096 == 4100 % 4096
    assert acl.rt.host_get_device_pointer(host + 4200, 0) == (dev + 100, 0)
    values = host_array(host + 4100, 2000, np.int32)
    values[:] = np.arange(2000)
    binary, _ = acl.rt.binary_load_from_data(KERNELS.encode(), None)
    bump, _ = acl.rt.binary_get_function(binary, "bump")
    stream, _ = acl.rt.create_stream()
    assert launch(acl, bump, stream, 1, dev, 2000) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(values, np.arange(1, 2001))
    # a view past the registered range is a memory fault
    assert launch(acl, bump, stream, 1, dev, 2001) == 0
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    # so is a copy past it
    big = np.zeros(3000, np.int32)
    assert acl.rt.memcpy(big.ctypes.data, big.nbytes, dev, big.nbytes, D2H) == PARAM
    assert acl.rt.host_unregister(host + 4100) == 0
    assert acl.rt.free_host(host) == 0
    acl.rt.destroy_stream_force(stream)
    assert acl.rt.binary_unload(binary) == 0


def test_codes_of_bad_input(acl):
    host, _ = acl.rt.malloc_host(8192)
    assert acl.rt.host_register(0, 16, 0) == (0, INVALID)
    assert acl.rt.host_register(host, 0, 0) == (0, INVALID)
    assert acl.rt.host_register(host, 16, 0x2)[1] == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.rt.host_register_v2(0, 16, codes.ACL_HOST_REG_MAPPED) == INVALID
    assert acl.rt.host_register_v2(host, 0, codes.ACL_HOST_REG_MAPPED) == INVALID
    assert acl.rt.host_register_v2(host, 16, 0) == PARAM
    assert acl.rt.host_register_v2(host, 16, 0x1) == PARAM
    assert acl.rt.host_get_device_pointer(0, 0) == (0, INVALID)
    assert acl.rt.host_get_device_pointer(host, 1) == (0, INVALID)
    assert acl.rt.host_get_device_pointer(host, 0) == (0, PARAM)
    assert acl.rt.host_unregister(0) == INVALID
    assert acl.rt.host_unregister(host) == codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED
    # private host memory cannot be mapped by another process
    private = np.zeros(4096, np.uint8)
    dev, ret = acl.rt.host_register(private.ctypes.data, 4096, 0)
    assert (dev, ret) == (0, codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    assert "private page" in acl.get_recent_err_msg()
    # beyond the pinned block
    assert acl.rt.host_register(host, 8193, 0)[1] == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    # twice, or overlapping
    assert acl.rt.host_register_v2(host, 4096, codes.ACL_HOST_REG_MAPPED) == 0
    assert (
        acl.rt.host_register_v2(host + 100, 16, codes.ACL_HOST_REG_MAPPED)
        == codes.ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED
    )
    assert (
        acl.rt.host_register(host, 4096, 0)[1] == codes.ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED
    )
    assert acl.rt.host_unregister(host + 16) == codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED
    # pinned only: registered, no device pointer
    assert acl.rt.host_register_v2(host + 4096, 4096, codes.ACL_HOST_REG_PINNED) == 0
    assert acl.rt.host_get_device_pointer(host + 4096, 0) == (0, PARAM)
    assert acl.rt.host_unregister(host + 4096) == 0
    # freeing the memory unregisters it
    dev, _ = acl.rt.host_get_device_pointer(host, 0)
    assert acl.rt.free_host(host) == 0
    assert acl.rt.host_get_device_pointer(host, 0) == (0, PARAM)
    out = np.zeros(16, np.uint8)
    assert acl.rt.memcpy(out.ctypes.data, 16, dev, 16, D2H) == PARAM


def test_another_client_cannot_reach_registered_memory(acl, daemon):
    host, _ = acl.rt.malloc_host(4096)
    secret = host_array(host, 1024, np.int32)
    secret[:] = 42
    dev, ret = acl.rt.host_register(host, 4096, 0)
    assert ret == 0
    code = f"""
    import struct, numpy as np, acl
    acl.init(); acl.rt.set_device(0)
    out = np.zeros(1024, np.int32)
    print(acl.rt.memcpy(out.ctypes.data, 4096, {dev}, 4096, {D2H}))
    print(acl.rt.memset({dev}, 4096, 0, 4096))
    print(acl.rt.host_unregister({host}))
    binary, _ = acl.rt.binary_load_from_data({KERNELS!r}.encode(), None)
    bump, _ = acl.rt.binary_get_function(binary, "bump")
    stream, _ = acl.rt.create_stream()
    args = struct.pack("<QQ", {dev}, 1024)
    acl.rt.launch_kernel_with_host_args(
        bump, 1, stream, None, acl.util.bytes_to_ptr(args), len(args))
    print(acl.rt.synchronize_stream(stream))
    """
    done = run_client(daemon.address, code)
    assert done.stdout.split() == [
        str(PARAM),
        str(PARAM),
        str(codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED),
        str(codes.ACL_ERROR_RT_DEVICE_MEM_ERROR),
    ], done.stderr
    assert (secret == 42).all()
    assert acl.rt.host_unregister(host) == 0
    assert acl.rt.free_host(host) == 0


def test_a_client_killed_holding_registered_memory_leaks_nothing(acl, daemon):
    before = set(simnpu_segments())
    code = """
    import time, acl
    acl.init(); acl.rt.set_device(0)
    host, _ = acl.rt.malloc_host(1 << 20)
    dev, ret = acl.rt.host_register(host, 1 << 20, 0)
    print(ret, flush=True)
    time.sleep(600)
    """
    client = start_client(daemon.address, code)
    try:
        assert client.stdout.readline().split() == ["0"]
        assert len(set(simnpu_segments()) - before) >= 1
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    deadline = time.monotonic() + 60
    while set(simnpu_segments()) - before:
        assert time.monotonic() < deadline, "the pinned segment outlived its client"
        time.sleep(0.05)
    # the daemon still serves, and registers again
    host, _ = acl.rt.malloc_host(4096)
    assert acl.rt.host_register(host, 4096, 0)[1] == 0
    assert acl.rt.free_host(host) == 0


@pytest.mark.parametrize("size", [-1, 1 << 64, 2**63])
def test_hostile_sizes_are_codes(acl, size):
    host, _ = acl.rt.malloc_host(4096)
    assert acl.rt.host_register(host, size, 0)[1] in (INVALID, PARAM)
    assert acl.rt.host_register_v2(host, size, codes.ACL_HOST_REG_MAPPED) in (INVALID, PARAM)
    assert acl.rt.free_host(host) == 0
