"""acl.rt kernels: binaries, functions, launches with device and host arguments."""

from __future__ import annotations

import struct

import numpy as np
import pytest

N = 1000
SCALE = """
import numpy as np
from simnpu import kernel

@kernel("ptr", "ptr", "f32", "u32")
def scale_f32(ctx, x, y, factor, n):
    share = -(-n // ctx.block_num)
    start = ctx.block_idx * share
    count = max(0, min(n, start + share) - start)
    if count:
        np.multiply(ctx.gm(x + 4 * start, "float32", count, access="r"), factor,
                    out=ctx.gm(y + 4 * start, "float32", count))

@kernel("ptr")
def fails(ctx, x):
    raise ValueError("this kernel always fails")
"""


@pytest.fixture
def buffers(acl):
    """x = 0..N-1 on the device, y zeroed; yields (x, y)."""
    x_host = np.arange(N, dtype=np.float32).tobytes()
    x, _ = acl.rt.malloc(N * 4, 0)
    y, _ = acl.rt.malloc(N * 4, 0)
    assert (
        acl.rt.memcpy(x, N * 4, acl.util.bytes_to_ptr(x_host), N * 4, acl.ACL_MEMCPY_HOST_TO_DEVICE)
        == 0
    )
    assert acl.rt.memset(y, N * 4, 0, N * 4) == 0
    yield x, y
    acl.rt.free(x)
    acl.rt.free(y)


def read(acl, ptr, count=N):
    out = bytes(count * 4)
    assert (
        acl.rt.memcpy(
            acl.util.bytes_to_ptr(out), len(out), ptr, len(out), acl.ACL_MEMCPY_DEVICE_TO_HOST
        )
        == 0
    )
    return np.frombuffer(out, np.float32)


def test_builtin_kernel_with_device_args(acl, buffers):
    """aclrtLaunchKernel: the argument struct is copied to device memory first."""
    x, y = buffers
    add, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
    assert ret == 0 and add
    args = struct.pack("<QQQI", x, x, y, N)
    dev_args, _ = acl.rt.malloc(len(args), 0)
    assert (
        acl.rt.memcpy(
            dev_args,
            len(args),
            acl.util.bytes_to_ptr(args),
            len(args),
            acl.ACL_MEMCPY_HOST_TO_DEVICE,
        )
        == 0
    )
    stream, _ = acl.rt.create_stream()
    assert acl.rt.launch_kernel(add, 3, dev_args, len(args), stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(read(acl, y), 2 * np.arange(N, dtype=np.float32))
    assert acl.rt.launch_kernel(add, 3, 0, len(args), stream) == acl.ACL_ERROR_INVALID_PARAM
    assert (
        acl.rt.launch_kernel(add, 0, dev_args, len(args), stream) == acl.ACL_ERROR_RT_PARAM_INVALID
    )
    assert (
        acl.rt.launch_kernel(add, 1, dev_args, 8, stream) == acl.ACL_ERROR_RT_PARAM_INVALID
    )  # too short
    assert acl.rt.free(dev_args) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_kernel_with_host_args_from_bytes_and_pinned_memory(acl, buffers):
    x, y = buffers
    binary, ret = acl.rt.binary_load_from_data(SCALE.encode(), None)
    assert ret == 0
    scale, ret = acl.rt.binary_get_function(binary, "scale_f32")
    assert ret == 0
    args = struct.pack("<QQfI", x, y, 3.0, N)
    assert (
        acl.rt.launch_kernel_with_host_args(
            scale, 4, 0, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.synchronize_stream(0) == 0
    assert np.array_equal(read(acl, y), 3 * np.arange(N, dtype=np.float32))
    pinned, _ = acl.rt.malloc_host(64)
    import ctypes

    ctypes.memmove(pinned, struct.pack("<QQfI", x, y, -1.0, N), 24)
    for cfg in (0, []):
        assert acl.rt.launch_kernel_with_host_args(scale, 2, 0, cfg, pinned, 24, [], 0) == 0
    assert acl.rt.synchronize_stream(0) == 0
    assert np.array_equal(read(acl, y), -np.arange(N, dtype=np.float32))
    hp = acl.util.bytes_to_ptr(args)
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0, [{"id": 1, "value": 0}], hp, 24)
        == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    )
    assert "cfg" in acl.get_recent_err_msg()
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0, None, hp, 24, [{"addrOffset": 0}], 1)
        == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    )
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0, None, 0, 24) == acl.ACL_ERROR_INVALID_PARAM
    )
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0, None, x, 24)
        == acl.ACL_ERROR_RT_PARAM_INVALID
    )
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0, None, hp, 12)
        == acl.ACL_ERROR_RT_PARAM_INVALID
    )
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0x4444, None, hp, 24)
        == acl.ACL_ERROR_RT_INVALID_HANDLE
    )
    assert acl.rt.free_host(pinned) == 0
    assert acl.rt.binary_unload(binary) == 0
    assert (
        acl.rt.launch_kernel_with_host_args(scale, 1, 0, None, hp, 24)
        == acl.ACL_ERROR_RT_INVALID_HANDLE
    )


def test_binary_load_from_file(acl, buffers, tmp_path):
    x, _ = buffers
    module = tmp_path / "kernels.py"
    module.write_text(SCALE)
    binary, ret = acl.rt.binary_load_from_file(
        str(module), [{"type": 1, "value": 1}]
    )  # load options accepted
    assert ret == 0
    assert acl.rt.binary_get_function(binary, "scale_f32")[1] == 0
    assert acl.rt.binary_get_function(binary, "missing") == (0, acl.ACL_ERROR_RT_KERNEL_LOOKUP)
    assert "scale_f32" in acl.get_recent_err_msg()  # it names what the module has
    fails, _ = acl.rt.binary_get_function(binary, "fails")
    args = struct.pack("<Q", x)
    assert (
        acl.rt.launch_kernel_with_host_args(fails, 1, 0, None, acl.util.bytes_to_ptr(args), 8) == 0
    )
    assert acl.rt.synchronize_stream(0) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "this kernel always fails" in acl.get_recent_err_msg()
    assert acl.rt.binary_unload(binary) == 0
    assert acl.rt.binary_unload(binary) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.binary_load_from_file(str(tmp_path / "absent.py")) == (
        0,
        acl.ACL_ERROR_RT_FILE_OPEN,
    )
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert acl.rt.binary_load_from_file(str(broken)) == (0, acl.ACL_ERROR_INVALID_FILE)
    elf = tmp_path / "kernel.o"
    elf.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    assert acl.rt.binary_load_from_file(str(elf)) == (0, acl.ACL_ERROR_INVALID_FILE)
    assert "compiled Ascend C binary" in acl.get_recent_err_msg()
    with pytest.raises(ValueError):
        acl.rt.binary_load_from_file(str(module), "not a list")
    with pytest.raises(TypeError):
        acl.rt.binary_load_from_data(12345)
