"""Managed memory against a real daemon: usable at one pointer from the host and from
kernels, freed with aclrtFree; the codes for bad input; another client cannot reach it; a
client killed holding it leaves nothing behind."""

from __future__ import annotations

import ctypes
import signal
import struct
import time

import numpy as np
from conftest import run_client, simnpu_segments, start_client

from simnpu.proto import codes

KERNELS = """
from simnpu import kernel

@kernel("ptr", "u64")
def double(ctx, x, n):
    ctx.gm(x, "int32", n)[:] *= 2
"""
GLOBAL = codes.ACL_RT_MEM_ATTACH_GLOBAL
D2H = codes.ACL_MEMCPY_DEVICE_TO_HOST


def launch(acl, function, stream, *values: int) -> int:
    args = struct.pack(f"<{len(values)}Q", *values)
    return acl.rt.launch_kernel_with_host_args(
        function, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )


def test_host_and_kernels_share_the_pointer(acl):
    ptr, ret = acl.rt.mem_alloc_managed(4096 * 4, GLOBAL)
    assert ret == 0 and ptr
    values = np.frombuffer((ctypes.c_int32 * 4096).from_address(ptr), np.int32)
    values[:] = np.arange(4096)
    binary, _ = acl.rt.binary_load_from_data(KERNELS.encode(), None)
    double, _ = acl.rt.binary_get_function(binary, "double")
    stream, _ = acl.rt.create_stream()
    assert launch(acl, double, stream, ptr + 400, 4096 - 100) == 0  # an interior pointer
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(values[:100], np.arange(100))
    assert np.array_equal(values[100:], 2 * np.arange(100, 4096))
    # past its end is a memory fault
    assert launch(acl, double, stream, ptr, 4097) == 0
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    # copies from it are pinned copies
    out = np.zeros(4096, np.int32)
    assert acl.rt.memcpy(out.ctypes.data, out.nbytes, ptr, out.nbytes, 0) == 0
    assert np.array_equal(out, values)
    assert acl.rt.free_host(ptr) == codes.ACL_ERROR_RT_PARAM_INVALID  # aclrtFree frees it
    assert acl.rt.host_unregister(ptr) == codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED
    assert acl.rt.free(ptr) == 0
    assert acl.rt.free(ptr) == codes.ACL_ERROR_RT_PARAM_INVALID
    acl.rt.destroy_stream_force(stream)
    assert acl.rt.binary_unload(binary) == 0


def test_codes_of_bad_input(acl):
    assert acl.rt.mem_alloc_managed(4096, 0) == (0, codes.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.mem_alloc_managed(4096, 2) == (0, codes.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.mem_alloc_managed(0, GLOBAL) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.mem_alloc_managed(1 << 64, GLOBAL)[1] != 0
    assert acl.rt.mem_alloc_managed(-1, GLOBAL)[1] != 0
    for call, args in (
        (acl.rt.mem_managed_advise, (1, 4096, 0, {"type": 1, "id": 0})),
        (acl.rt.mem_managed_get_attr, (1, 1, 4096, 4)),
    ):
        result = call(*args)
        ret = result if isinstance(result, int) else result[-1]
        assert ret == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT


def test_another_client_cannot_reach_managed_memory(acl, daemon):
    ptr, _ = acl.rt.mem_alloc_managed(4096, GLOBAL)
    values = np.frombuffer((ctypes.c_int32 * 1024).from_address(ptr), np.int32)
    values[:] = 5
    dev, ret = acl.rt.host_get_device_pointer(ptr, 0)
    assert ret == 0
    code = f"""
    import struct, acl
    acl.init(); acl.rt.set_device(0)
    binary, _ = acl.rt.binary_load_from_data({KERNELS!r}.encode(), None)
    double, _ = acl.rt.binary_get_function(binary, "double")
    stream, _ = acl.rt.create_stream()
    for target in ({ptr}, {dev}):
        args = struct.pack("<QQ", target, 1024)
        acl.rt.launch_kernel_with_host_args(
            double, 1, stream, None, acl.util.bytes_to_ptr(args), len(args))
        print(acl.rt.synchronize_stream(stream))
    print(acl.rt.free({ptr}))
    """
    done = run_client(daemon.address, code)
    fault = str(codes.ACL_ERROR_RT_DEVICE_MEM_ERROR)
    assert done.stdout.split() == [fault, fault, str(codes.ACL_ERROR_RT_PARAM_INVALID)], done.stderr
    assert (values == 5).all()
    assert acl.rt.free(ptr) == 0


def test_a_client_killed_holding_managed_memory_leaks_nothing(acl, daemon):
    before = set(simnpu_segments())
    code = """
    import time, acl
    acl.init(); acl.rt.set_device(0)
    ptr, ret = acl.rt.mem_alloc_managed(1 << 20, 1)
    print(ret, flush=True)
    time.sleep(600)
    """
    client = start_client(daemon.address, code)
    try:
        assert client.stdout.readline().split() == ["0"]
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    deadline = time.monotonic() + 60
    while set(simnpu_segments()) - before:
        assert time.monotonic() < deadline, "the managed memory outlived its client"
        time.sleep(0.05)
    ptr, ret = acl.rt.mem_alloc_managed(4096, GLOBAL)
    assert ret == 0 and acl.rt.free(ptr) == 0
