"""acl.rt float overflow: the saturation mode (what built-in kernels, reduces and user kernels
compute in each mode), streams' overflow switches, and the overflow status that kernels raise
(ctx.raise_overflow, a built-in's float overflow), read and reset in stream order."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import GATE, round_trip, runtime_of

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError

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


def get(acl, ptr: int, size: int) -> bytes:
    out = bytes(size)
    ret = acl.rt.memcpy(acl.util.bytes_to_ptr(out), size, ptr, size, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    assert ret == 0
    return out


SAT = codes.ACL_RT_OVERFLOW_MODE_SATURATION
INFNAN = codes.ACL_RT_OVERFLOW_MODE_INFNAN
F16_MAX = float(np.finfo(np.float16).max)
F32_MAX = float(np.finfo(np.float32).max)

# what a kernel computes when it does not saturate, what it sees of the mode, and what it
# computes when it asks for the mode's results
MODE_PROBE = b"""
import numpy as np
from simnpu import kernel

@kernel("ptr")
def probe(ctx, out):
    view = ctx.gm(out, "float32", 3)
    view[0] = np.float32(ctx.saturation)
    view[1:] = np.float32(3e38)
    view[1:] *= np.float32(10)
    ctx.saturate(view[2:])
"""


def test_the_mode_is_the_process_s_and_outlives_reset_device(acl, daemon):
    """aclrtSetDeviceSatMode / aclrtGetDeviceSatMode: Inf/NaN until set; bad modes 107000 and
    change nothing; kept across aclrtResetDevice; another process's mode is its own."""
    assert acl.rt.get_device_sat_mode() == (INFNAN, 0)
    assert acl.rt.set_device_sat_mode(INFNAN) == 0
    assert acl.rt.set_device_sat_mode(SAT) == 0
    assert acl.rt.get_device_sat_mode() == (SAT, 0)
    for mode in (codes.ACL_RT_OVERFLOW_MODE_UNDEF, -1, 1 << 20):
        assert acl.rt.set_device_sat_mode(mode) == codes.ACL_ERROR_RT_PARAM_INVALID
        assert "float overflow mode" in acl.get_recent_err_msg()
    assert acl.rt.get_device_sat_mode() == (SAT, 0)
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.set_device(0) == 0
    assert acl.rt.get_device_sat_mode() == (SAT, 0)
    with runtime_of(daemon.address) as rt:
        assert rt.devices.get_device_sat_mode() == INFNAN
        with pytest.raises(NpuError) as refused:  # the daemon checks the mode too
            rt.connection.call(pb.SetDeviceSatModeRequest(mode=2))
        assert refused.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
        round_trip(rt)  # the daemon and this client are unharmed
    assert acl.rt.set_device_sat_mode(INFNAN) == 0
    assert acl.rt.get_device_sat_mode() == (INFNAN, 0)


def launch(acl, name: str, stream: int, x: int, y: int, z: int, n: int) -> None:
    function, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, name)
    assert ret == 0
    args = struct.pack("<QQQI", x, y, z, n)
    ptr = acl.util.bytes_to_ptr(args)
    assert acl.rt.launch_kernel_with_host_args(function, 2, stream, None, ptr, len(args)) == 0


def built_in_results(acl, stream: int, buffer: int) -> tuple[list, list, int]:
    """add_f16 and mul_f32 of values that overflow (and a NaN) on `stream`: their results
    and the overflow status they leave (reset first)."""
    x16 = np.array([60000, -60000, 1, np.nan], np.float16)
    y16 = np.array([60000, -60000, 2, 0], np.float16)
    x32 = np.array([3e38, -3e38, 1.5, np.inf], np.float32)
    y32 = np.array([10, 10, 2, 0], np.float32)  # inf * 0: NaN
    ptrs = [put(acl, a.tobytes()) for a in (x16, y16, x16, x32, y32, x32)]
    assert acl.rt.reset_overflow_status(stream) == 0
    launch(acl, "add_f16", stream, ptrs[0], ptrs[1], ptrs[2], 4)
    launch(acl, "mul_f32", stream, ptrs[3], ptrs[4], ptrs[5], 4)
    flag = status(acl, buffer, stream)
    f16 = np.frombuffer(get(acl, ptrs[2], 8), np.float16).astype(float).tolist()
    f32 = np.frombuffer(get(acl, ptrs[5], 16), np.float32).astype(float).tolist()
    for ptr in ptrs:
        assert acl.rt.free(ptr) == 0
    return f16, f32, flag


def same(got: list, expected: list) -> bool:
    return np.array_equal(np.array(got), np.array(expected), equal_nan=True)


def test_built_in_kernels_saturate_on_the_streams_created_in_saturation_mode(acl, daemon):
    """fp16 and fp32 overflow: inf (and NaN) in the Inf/NaN mode, the largest finite value
    (and 0) in the saturation mode; the overflow status is raised in both. A stream keeps
    the mode it was created in; another client's streams keep theirs."""
    buffer, _ = acl.rt.malloc(64, 0)
    inf = float("inf")
    before, _ = acl.rt.create_stream()
    f16, f32, flag = built_in_results(acl, before, buffer)
    assert same(f16, [inf, -inf, 3.0, np.nan]) and same(f32, [inf, -inf, 3.0, np.nan])
    assert flag == 1

    assert acl.rt.set_device_sat_mode(SAT) == 0
    stream, _ = acl.rt.create_stream()
    f16, f32, flag = built_in_results(acl, stream, buffer)
    assert f16 == [F16_MAX, -F16_MAX, 3.0, 0.0]
    assert f32 == [F32_MAX, -F32_MAX, 3.0, 0.0]
    assert flag == 1  # saturated, and still reported
    f16, _, flag = built_in_results(acl, before, buffer)  # created in the Inf/NaN mode
    assert same(f16, [inf, -inf, 3.0, np.nan]) and flag == 1
    f16, _, _ = built_in_results(acl, 0, buffer)  # the default stream too (set_device)
    assert same(f16, [inf, -inf, 3.0, np.nan])
    with runtime_of(daemon.address) as rt:  # another process: its own mode, Inf/NaN
        round_trip(rt, value=inf)

    assert acl.rt.set_device_sat_mode(INFNAN) == 0
    assert built_in_results(acl, stream, buffer)[0] == [F16_MAX, -F16_MAX, 3.0, 0.0]  # kept
    after, _ = acl.rt.create_stream()
    f16, f32, flag = built_in_results(acl, after, buffer)
    assert same(f16, [inf, -inf, 3.0, np.nan]) and same(f32, [inf, -inf, 3.0, np.nan])
    for handle in (before, stream, after):
        assert acl.rt.destroy_stream(handle) == 0
    assert acl.rt.free(buffer) == 0


def test_reduce_sum_overflow_in_both_modes(acl):
    """aclrtReduceAsync SUM that overflows: inf or the largest finite value, status raised."""
    buffer, _ = acl.rt.malloc(64, 0)
    expected = {INFNAN: (float("inf"), float("inf")), SAT: (F16_MAX, F32_MAX)}
    for mode in (SAT, INFNAN):
        assert acl.rt.set_device_sat_mode(mode) == 0
        stream, _ = acl.rt.create_stream()
        got = []
        for data_type, kind in ((codes.ACL_FLOAT16, np.float16), (codes.ACL_FLOAT, np.float32)):
            big = np.full(8, np.finfo(kind).max / 2 * 1.5, kind)
            dst, src = put(acl, big.tobytes()), put(acl, big.tobytes())
            assert acl.rt.reset_overflow_status(stream) == 0
            ret = acl.rt.reduce_async(
                dst, src, big.nbytes, codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM, data_type, stream, 0
            )
            assert ret == 0
            assert status(acl, buffer, stream) == 1
            values = set(np.frombuffer(get(acl, dst, big.nbytes), kind).astype(float).tolist())
            got.append(values.pop())
            assert not values
            for ptr in (dst, src):
                assert acl.rt.free(ptr) == 0
        assert tuple(got) == expected[mode], mode
        assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(buffer) == 0


def test_user_kernels_see_the_mode_and_saturate_what_they_ask_for(acl):
    """ctx.saturation is the stream's mode; a kernel's own arithmetic is IEEE's, and
    ctx.saturate applies the mode to the results it names."""
    binary, ret = acl.rt.binary_load_from_data(MODE_PROBE, None)
    assert ret == 0
    probe, _ = acl.rt.binary_get_function(binary, "probe")
    out, _ = acl.rt.malloc(12, 0)
    buffer, _ = acl.rt.malloc(64, 0)
    inf = float("inf")
    for mode, expected in ((SAT, [1.0, inf, F32_MAX]), (INFNAN, [0.0, inf, inf])):
        assert acl.rt.set_device_sat_mode(mode) == 0
        stream, _ = acl.rt.create_stream()
        arg = struct.pack("<Q", out)
        ptr = acl.util.bytes_to_ptr(arg)
        assert acl.rt.reset_overflow_status(stream) == 0
        assert acl.rt.launch_kernel_with_host_args(probe, 1, stream, None, ptr, len(arg)) == 0
        assert status(acl, buffer, stream) == 1
        assert np.frombuffer(get(acl, out, 12), np.float32).astype(float).tolist() == expected
        assert acl.rt.destroy_stream(stream) == 0
    for ptr in (out, buffer):
        assert acl.rt.free(ptr) == 0
    assert acl.rt.binary_unload(binary) == 0


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
        other = rt.memory.malloc(64)
        rt.devices.get_overflow_status(other, 64, 0)
        rt.sync.synchronize_stream(0)
        seen = np.zeros(64, np.uint8)
        rt.memory.memcpy(seen.ctypes.data, 64, other, 64, codes.ACL_MEMCPY_DEVICE_TO_HOST)
        assert not seen.any()
        rt.memory.free(other)
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
