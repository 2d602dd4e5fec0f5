"""acl.rt's kernel-arguments builder and launch_kernel_with_config, as the CANN runtime's
launch_kernel sample uses them (simple and place-holder modes), against a real daemon."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

N = 2048
ADD = """
import numpy as np
from simnpu import kernel

@kernel("ptr", "ptr", "ptr", "ptr", "ptr")
def add_custom(ctx, x, y, z, length, tiles):
    n = int(ctx.gm(length, "int32", 1, access="r")[0])
    share = -(-n // ctx.block_num)
    start = ctx.block_idx * share
    count = max(0, min(n, start + share) - start)
    if count:
        np.add(ctx.gm(x + 2 * start, "float16", count, access="r"),
               ctx.gm(y + 2 * start, "float16", count, access="r"),
               out=ctx.gm(z + 2 * start, "float16", count))
    assert int(ctx.gm(tiles, "int32", 1, access="r")[0]) == 8

@kernel("ptr", "u32", "f32")
def fill(ctx, out, n, value):
    if ctx.block_idx == 0:
        ctx.gm(out, "float32", n)[:] = value

@kernel()
def spin(ctx):
    import time
    time.sleep(30)
"""


@pytest.fixture
def setup(acl):
    binary, ret = acl.rt.binary_load_from_data(ADD)
    assert ret == 0
    stream, _ = acl.rt.create_stream()
    x_host = np.arange(N, dtype=np.float16)
    y_host = np.full(N, 2, dtype=np.float16)
    pointers = []
    for data in (x_host, y_host, np.zeros(N, np.float16)):
        dev, ret = acl.rt.malloc(N * 2, 0)
        assert ret == 0
        raw = data.tobytes()
        assert acl.rt.memcpy(dev, N * 2, acl.util.bytes_to_ptr(raw), N * 2, 1) == 0
        pointers.append(dev)
    yield binary, stream, pointers, x_host + y_host
    for dev in pointers:
        assert acl.rt.free(dev) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.binary_unload(binary) == 0


def _append_pointer(acl, handle, address):
    box = ctypes.c_uint64(address)
    param, ret = acl.rt.kernel_args_append(handle, ctypes.addressof(box), 8)
    assert ret == 0 and param
    return param


def _place_holder(acl, handle, value):
    param, ret = acl.rt.kernel_args_append_place_holder(handle)
    assert ret == 0 and param
    return param, value


def _fill_place_holders(acl, handle, entries):
    for param, value in entries:
        buffer, ret = acl.rt.kernel_args_get_place_holder_buffer(handle, param, 4)
        assert ret == 0 and buffer
        ctypes.c_int32.from_address(buffer).value = value


def _read(acl, dev, count=N, dtype=np.float16):
    out = bytes(count * np.dtype(dtype).itemsize)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), len(out), dev, len(out), 2) == 0
    return np.frombuffer(out, dtype)


def _build(acl, func, pointers, length=N):
    handle, ret = acl.rt.kernel_args_init(func)
    assert ret == 0 and handle
    for dev in pointers:
        _append_pointer(acl, handle, dev)
    entries = [_place_holder(acl, handle, length), _place_holder(acl, handle, 8)]
    _fill_place_holders(acl, handle, entries)
    assert acl.rt.kernel_args_finalize(handle) == 0
    return handle


def test_place_holder_launch_as_the_sample(acl, setup):
    """The sample's place-holder mode: x, y, z appended, length and tile count placed."""
    binary, stream, pointers, expected = setup
    func, ret = acl.rt.binary_get_function(binary, "add_custom")
    assert ret == 0
    free_before, _, _ = acl.rt.get_mem_info(0)
    handle = _build(acl, func, pointers)
    assert acl.rt.launch_kernel_with_config(func, 8, stream, None, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(_read(acl, pointers[2]), expected)
    # the launch's place-holder memory was freed when it completed
    assert acl.rt.get_mem_info(0)[0] == free_before
    # the handle launches again; a second init on the thread resets the same handle
    assert acl.rt.launch_kernel_with_config(func, 3, stream, 0, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    again, ret = acl.rt.kernel_args_init(func)
    assert (again, ret) == (handle, 0)
    assert acl.rt.launch_kernel_with_config(func, 1, stream, None, handle, 0) == (
        acl.ACL_ERROR_RT_PARAM_INVALID
    )


def test_a_captured_place_holder_launch_replays_and_frees_its_block_with_the_model(acl, setup):
    """Each replay reads the place holders the captured launch wrote; their device block
    lives as long as the model (aclmdlRI, docs/graph-capture.md)."""
    binary, stream, pointers, expected = setup
    func, _ = acl.rt.binary_get_function(binary, "add_custom")
    free_before, _, _ = acl.rt.get_mem_info(0)
    handle = _build(acl, func, pointers)
    assert acl.mdl.ri_capture_begin(stream, acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED) == 0
    assert acl.rt.launch_kernel_with_config(func, 8, stream, None, handle, 0) == 0
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0
    for _ in range(3):
        assert acl.rt.memset(pointers[2], N * 2, 0, N * 2) == 0
        assert acl.mdl.ri_execute_async(model, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0, acl.get_recent_err_msg()
        assert np.array_equal(_read(acl, pointers[2]), expected)
    assert acl.rt.get_mem_info(0)[0] < free_before  # the model holds the block
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.get_mem_info(0)[0] == free_before


def test_scalars_para_update_and_attributes(acl, setup):
    binary, stream, pointers, _ = setup
    func, _ = acl.rt.binary_get_function(binary, "fill")
    handle, _ = acl.rt.kernel_args_init(func)
    _append_pointer(acl, handle, pointers[2])
    count = ctypes.c_uint32(16)
    n_param, ret = acl.rt.kernel_args_append(handle, ctypes.addressof(count), 4)
    assert ret == 0
    value = ctypes.c_float(1.5)
    v_param, ret = acl.rt.kernel_args_append(handle, ctypes.addressof(value), 4)
    assert ret == 0
    # nothing is appended past the kernel's parameters
    assert acl.rt.kernel_args_append(handle, ctypes.addressof(value), 4) == (
        0,
        acl.ACL_ERROR_RT_PARAM_INVALID,
    )
    assert acl.rt.kernel_args_finalize(handle) == 0
    cfg = {
        "attrs": [
            {"id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE, "value": {"schem_mode": 1}},
            {"id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT, "value": {"timeout": 60}},
            {"id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET, "value": {"block_dim_offset": 0}},
            {"id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP, "value": {"is_data_dump": 0}},
        ],
        "num_attrs": 4,
    }
    assert acl.rt.launch_kernel_with_config(func, 2, stream, cfg, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(_read(acl, pointers[2], 16, np.float32), np.full(16, 1.5, np.float32))
    # para_update, then the handle launches only once finalized again
    value.value = -2.0
    assert acl.rt.kernel_args_para_update(handle, v_param, ctypes.addressof(value), 4) == 0
    assert acl.rt.launch_kernel_with_config(func, 1, stream, None, handle, 0) == (
        acl.ACL_ERROR_RT_PARAM_INVALID
    )
    assert acl.rt.kernel_args_finalize(handle) == 0
    assert acl.rt.launch_kernel_with_config(func, 1, stream, None, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(_read(acl, pointers[2], 16, np.float32), np.full(16, -2.0, np.float32))
    # a size that is not the parameter's, a place holder's buffer of a plain parameter
    assert acl.rt.kernel_args_para_update(handle, n_param, ctypes.addressof(value), 8) == (
        acl.ACL_ERROR_RT_PARAM_INVALID
    )
    assert acl.rt.kernel_args_get_place_holder_buffer(handle, n_param, 4) == (
        0,
        acl.ACL_ERROR_RT_PARAM_INVALID,
    )


def test_bad_input(acl, setup):
    binary, stream, pointers, _ = setup
    func, _ = acl.rt.binary_get_function(binary, "add_custom")
    fill, _ = acl.rt.binary_get_function(binary, "fill")
    assert acl.rt.kernel_args_init(0) == (0, acl.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.kernel_args_init(0x1234) == (0, acl.ACL_ERROR_RT_INVALID_HANDLE)
    handle, _ = acl.rt.kernel_args_init(func)
    box = ctypes.c_uint64(pointers[0])
    assert acl.rt.kernel_args_append(0, ctypes.addressof(box), 8) == (
        0,
        acl.ACL_ERROR_INVALID_PARAM,
    )
    assert acl.rt.kernel_args_append(handle, 0, 8) == (0, acl.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.kernel_args_append(handle, ctypes.addressof(box), 0) == (
        0,
        acl.ACL_ERROR_INVALID_PARAM,
    )
    assert acl.rt.kernel_args_append(handle, ctypes.addressof(box), 4) == (
        0,
        acl.ACL_ERROR_RT_PARAM_INVALID,
    )
    assert acl.rt.kernel_args_append(handle + 99, ctypes.addressof(box), 8) == (
        0,
        acl.ACL_ERROR_RT_INVALID_HANDLE,
    )
    # finalize before every parameter is appended
    assert acl.rt.kernel_args_finalize(handle) == acl.ACL_ERROR_RT_PARAM_INVALID
    for dev in pointers:
        _append_pointer(acl, handle, dev)
    first, _ = acl.rt.kernel_args_append_place_holder(handle)
    assert acl.rt.kernel_args_get_place_holder_buffer(handle, first, 0) == (
        0,
        acl.ACL_ERROR_INVALID_PARAM,
    )
    assert acl.rt.kernel_args_get_place_holder_buffer(handle, first + 7, 4) == (
        0,
        acl.ACL_ERROR_RT_INVALID_HANDLE,
    )
    assert acl.rt.kernel_args_get_place_holder_buffer(handle, first, 1 << 20) == (
        0,
        acl.ACL_ERROR_RT_PARAM_INVALID,
    )
    buffer, ret = acl.rt.kernel_args_get_place_holder_buffer(handle, first, 4)
    assert ret == 0
    # nothing more is appended once a place-holder buffer was taken
    assert acl.rt.kernel_args_append_place_holder(handle) == (
        0,
        acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    )
    # not finalized: no launch; then launches that are refused at once
    assert acl.rt.launch_kernel_with_config(func, 1, stream, None, handle, 0) == (
        acl.ACL_ERROR_RT_PARAM_INVALID
    )
    handle = _build(acl, func, pointers)
    assert acl.rt.kernel_args_append_place_holder(handle) == (
        0,
        acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    )
    launch = acl.rt.launch_kernel_with_config
    assert launch(func, 0, stream, None, handle, 0) == acl.ACL_ERROR_INVALID_PARAM
    assert launch(func, 65536, stream, None, handle, 0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert launch(0, 1, stream, None, handle, 0) == acl.ACL_ERROR_INVALID_PARAM
    assert launch(func, 1, stream, None, 0, 0) == acl.ACL_ERROR_INVALID_PARAM
    assert launch(func, 1, stream, None, handle, 8) == acl.ACL_ERROR_INVALID_PARAM
    assert launch(fill, 1, stream, None, handle, 0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert launch(func, 1, 0xBAD, None, handle, 0) == acl.ACL_ERROR_RT_INVALID_HANDLE
    timeout = acl.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT
    both = {
        "attrs": [
            {"id": timeout, "value": {"timeout": 1}},
            {"id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US, "value": {"timeout_us": {}}},
        ],
        "num_attrs": 2,
    }
    assert launch(func, 1, stream, both, handle, 0) == acl.ACL_ERROR_RT_PARAM_INVALID
    bad_mode = {
        "attrs": [{"id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE, "value": {"schem_mode": 2}}],
        "num_attrs": 1,
    }
    assert launch(func, 1, stream, bad_mode, handle, 0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert launch(func, 1, stream, {"attrs": []}, handle, 0) == 0  # no attribute at all
    assert acl.rt.synchronize_stream(stream) == 0
    with pytest.raises(TypeError):
        launch(func, 1, stream, None, "handle", 0)


def test_timeout_attribute_ends_a_stuck_kernel(acl, setup):
    """ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US: the launch fails with 507014 past it, and the
    core carries on."""
    binary, stream, pointers, expected = setup
    spin, _ = acl.rt.binary_get_function(binary, "spin")
    handle, _ = acl.rt.kernel_args_init(spin)
    assert acl.rt.kernel_args_finalize(handle) == 0
    cfg = {
        "attrs": [
            {
                "id": acl.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US,
                "value": {"timeout_us": {"timeout_low": 500_000, "timeout_high": 0}},
            }
        ],
        "num_attrs": 1,
    }
    assert acl.rt.launch_kernel_with_config(spin, 1, stream, cfg, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_AICORE_TIMEOUT
    acl.get_recent_err_msg()
    add, _ = acl.rt.binary_get_function(binary, "add_custom")
    handle = _build(acl, add, pointers)
    other, _ = acl.rt.create_stream()
    assert acl.rt.launch_kernel_with_config(add, 2, other, None, handle, 0) == 0
    assert acl.rt.synchronize_stream(other) == 0
    assert np.array_equal(_read(acl, pointers[2]), expected)
    assert acl.rt.destroy_stream(other) == 0


def test_user_memory_handle(acl, setup):
    """aclrtKernelArgsInitByUserMem: the arguments are built in the program's memory."""
    binary, stream, pointers, _ = setup
    func, _ = acl.rt.binary_get_function(binary, "fill")
    size, ret = acl.rt.kernel_args_get_mem_size(func, 16)
    assert ret == 0 and size >= 16
    handle_size, ret = acl.rt.kernel_args_get_handle_mem_size(func)
    assert ret == 0 and handle_size > 0
    handle_mem = ctypes.create_string_buffer(handle_size)
    args_mem = ctypes.create_string_buffer(size)
    handle = ctypes.addressof(handle_mem)
    assert acl.rt.kernel_args_init_by_user_mem(func, handle, ctypes.addressof(args_mem), size) == 0
    assert acl.rt.kernel_args_init_by_user_mem(func, handle, 0, size) == acl.ACL_ERROR_INVALID_PARAM
    _append_pointer(acl, handle, pointers[2])
    count, value = ctypes.c_uint32(4), ctypes.c_float(3.0)
    acl.rt.kernel_args_append(handle, ctypes.addressof(count), 4)
    acl.rt.kernel_args_append(handle, ctypes.addressof(value), 4)
    assert struct.unpack_from("<QIf", args_mem.raw) == (pointers[2], 4, 3.0)
    assert acl.rt.kernel_args_finalize(handle) == 0
    assert acl.rt.launch_kernel_with_config(func, 1, stream, None, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(_read(acl, pointers[2], 4, np.float32), np.full(4, 3.0, np.float32))


def test_daemon_checks_forged_place_holders(acl, setup):
    """A record the builder would not make (a place holder on a scalar, or too much data)
    is refused by the daemon with 107000; the session and the daemon go on."""
    from simnpu.client import facade
    from simnpu.client.transport import call_site
    from simnpu.proto import commands

    binary, stream, pointers, _ = setup
    rt = facade.session()
    func, _ = acl.rt.binary_get_function(binary, "fill")
    args = struct.pack("<QIf", pointers[2], 4, 1.0)
    free_before = acl.rt.get_mem_info(0)[0]
    for place_holders in ([(8, b"\x01\x00\x00\x00")], [(0, bytes(65 * 1024))], [(0, b"")]):
        record = commands.LaunchWithConfig.pack(
            1, rt.contexts.stream(stream), func, 0, args, place_holders
        )
        rt.connection.send_command(record, call_site(), rt.contexts.stream(stream))
        assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_PARAM_INVALID
        acl.get_recent_err_msg()
    assert acl.rt.get_mem_info(0)[0] == free_before
    handle, _ = acl.rt.kernel_args_init(func)
    _append_pointer(acl, handle, pointers[2])
    count, value = ctypes.c_uint32(4), ctypes.c_float(7.0)
    acl.rt.kernel_args_append(handle, ctypes.addressof(count), 4)
    acl.rt.kernel_args_append(handle, ctypes.addressof(value), 4)
    assert acl.rt.kernel_args_finalize(handle) == 0
    assert acl.rt.launch_kernel_with_config(func, 1, stream, None, handle, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(_read(acl, pointers[2], 4, np.float32), np.full(4, 7.0, np.float32))
