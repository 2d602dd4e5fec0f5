"""acl.rt float overflow: the saturation mode, streams' overflow switches, and the overflow
status that kernels raise (ctx.raise_overflow, a built-in's float overflow), read and reset in
stream order."""

from __future__ import annotations

import struct

import numpy as np
from conftest import GATE, runtime_of

from simnpu.proto import codes

RAISER = b"""
from simnpu import kernel

@kernel("u32")
def raiser(ctx, block):
    if ctx.block_idx == block:
        ctx.raise_overflow()
"""


def status(acl, buffer, stream) -> int:
    """aclrtGetOverflowStatus into `buffer`, synchronize, read its uint64."""
    assert acl.rt.get_overflow_status(buffer, 64, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    out = bytes(64)
    ret = acl.rt.memcpy(acl.util.bytes_to_ptr(out), 64, buffer, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    assert ret == 0
    assert out[8:] == bytes(56)
    return int.from_bytes(out[:8], "little")


def put(acl, data: bytes) -> int:
    ptr, ret = acl.rt.malloc(len(data), 0)
    assert ret == 0
    ret = acl.rt.memcpy(
        ptr, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
    )
    assert ret == 0
    return ptr


def test_the_device_computes_in_inf_nan_mode_only(acl):
    """aclrtSetDeviceSatMode / aclrtGetDeviceSatMode."""
    assert acl.rt.get_device_sat_mode() == (acl.ACL_RT_OVERFLOW_MODE_INFNAN, 0)
    assert acl.rt.set_device_sat_mode(acl.ACL_RT_OVERFLOW_MODE_INFNAN) == 0
    assert (
        acl.rt.set_device_sat_mode(acl.ACL_RT_OVERFLOW_MODE_SATURATION)
        == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    )
    for mode in (acl.ACL_RT_OVERFLOW_MODE_UNDEF, -1, 1 << 20):
        assert acl.rt.set_device_sat_mode(mode) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.get_device_sat_mode() == (acl.ACL_RT_OVERFLOW_MODE_INFNAN, 0)


def test_stream_overflow_switches(acl):
    """aclrtSetStreamOverflowSwitch / aclrtGetStreamOverflowSwitch: per stream, 0 or 1."""
    stream, _ = acl.rt.create_stream()
    assert acl.rt.get_stream_overflow_switch(stream) == (0, 0)
    assert acl.rt.set_stream_overflow_switch(stream, 1) == 0
    assert acl.rt.get_stream_overflow_switch(stream) == (1, 0)
    assert acl.rt.get_stream_overflow_switch(0) == (0, 0)  # the default stream is another
    assert acl.rt.set_stream_overflow_switch(stream, 2) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.set_stream_overflow_switch(0x4444, 2) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.set_stream_overflow_switch(0x4444, 1) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.get_stream_overflow_switch(0x4444) == (0, codes.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.rt.set_stream_overflow_switch(stream, 0) == 0
    assert acl.rt.get_stream_overflow_switch(stream) == (0, 0)
    assert acl.rt.set_stream_overflow_switch(stream, 1) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.get_stream_overflow_switch(stream) == (0, codes.ACL_ERROR_RT_INVALID_HANDLE)


def test_kernels_raise_the_status_that_streams_read_and_reset(acl, daemon):
    """A built-in's float overflow and ctx.raise_overflow set the context's status;
    aclrtGetOverflowStatus writes it in stream order, aclrtResetOverflowStatus clears it;
    another client's status is its own."""
    stream, _ = acl.rt.create_stream()
    buffer, _ = acl.rt.malloc(64, 0)
    assert status(acl, buffer, stream) == 0
    n = 256
    big = put(acl, np.full(n, 60000, np.float16).tobytes())
    out, _ = acl.rt.malloc(2 * n, 0)
    add, _ = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f16")
    args = struct.pack("<QQQI", big, big, out, n)
    ptr = acl.util.bytes_to_ptr(args)
    assert acl.rt.launch_kernel_with_host_args(add, 2, stream, None, ptr, len(args)) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert status(acl, buffer, 0) == 1  # the status is the context's, read from any stream
    with runtime_of(daemon.address) as rt:  # another client: its context knows nothing of it
        other = rt.malloc(64)
        rt.get_overflow_status(other, 64, 0)
        rt.synchronize_stream(0)
        seen = np.zeros(64, np.uint8)
        rt.memcpy(seen.ctypes.data, 64, other, 64, codes.ACL_MEMCPY_DEVICE_TO_HOST)
        assert not seen.any()
        rt.free(other)
    assert acl.rt.reset_overflow_status(stream) == 0
    assert status(acl, buffer, stream) == 0
    small = struct.pack("<QQQI", out, out, out, 0)  # no element: nothing overflows
    ptr = acl.util.bytes_to_ptr(small)
    assert acl.rt.launch_kernel_with_host_args(add, 1, stream, None, ptr, len(small)) == 0
    assert status(acl, buffer, stream) == 0

    binary, ret = acl.rt.binary_load_from_data(RAISER, None)
    assert ret == 0
    raiser, _ = acl.rt.binary_get_function(binary, "raiser")
    for block, expected in ((7, 0), (3, 1)):  # a launch of 4 blocks: block 7 never runs
        arg = struct.pack("<I", block)
        ptr = acl.util.bytes_to_ptr(arg)
        assert acl.rt.launch_kernel_with_host_args(raiser, 4, stream, None, ptr, len(arg)) == 0
        assert status(acl, buffer, stream) == expected
    assert acl.rt.reset_overflow_status(0) == 0
    assert status(acl, buffer, stream) == 0
    for ptr in (buffer, big, out):
        assert acl.rt.free(ptr) == 0
    assert acl.rt.binary_unload(binary) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_bad_overflow_status_arguments(acl):
    """Null, a wrong size, memory that is not this process's, a bad stream: refused at once;
    a buffer freed before the stream reached the read fails the stream's synchronize."""
    stream, _ = acl.rt.create_stream()
    buffer, _ = acl.rt.malloc(64, 0)
    assert acl.rt.get_overflow_status(0, 64, stream) == acl.ACL_ERROR_INVALID_PARAM
    for size in (0, 32, 128):
        assert acl.rt.get_overflow_status(buffer, size, stream) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.get_overflow_status(buffer + 8, 64, stream) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.get_overflow_status(0x1234000, 64, stream) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.get_overflow_status(buffer, 64, 0x4444) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.reset_overflow_status(0x4444) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.synchronize_stream(stream) == 0  # none of them reached the device

    binary, _ = acl.rt.binary_load_from_data(GATE.encode(), None)
    gate, _ = acl.rt.binary_get_function(binary, "gate")
    flag = put(acl, bytes(4))
    args = struct.pack("<Qd", flag, 60.0)
    ptr = acl.util.bytes_to_ptr(args)
    assert acl.rt.launch_kernel_with_host_args(gate, 1, stream, None, ptr, len(args)) == 0
    assert acl.rt.get_overflow_status(buffer, 64, stream) == 0
    assert acl.rt.free(buffer) == 0  # before the stream gets there
    one = struct.pack("<i", 1)
    ret = acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, acl.ACL_MEMCPY_HOST_TO_DEVICE)
    assert ret == 0
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert "freed before the task ran" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.free(flag) == 0
    assert acl.rt.binary_unload(binary) == 0
    assert acl.rt.destroy_stream(stream) == 0
