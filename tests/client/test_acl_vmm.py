"""acl.rt virtual memory management against a real daemon: reserved ranges, physical memory,
mappings, and mapped memory used like aclrtMalloc's by copies, memsets and kernels (the
module's daemon: one device of 256 MiB)."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from conftest import GATE, run_client

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

MiB = 1 << 20
GiB = 1 << 30
PROP = {
    "handle_type": 0,
    "allocation_type": 0,
    "mem_attr": codes.ACL_HBM_MEM_HUGE,
    "location": {"id": 0, "type": codes.ACL_MEM_LOCATION_TYPE_DEVICE},
    "reserve": 0,
}
H2D, D2H, D2D = (
    codes.ACL_MEMCPY_HOST_TO_DEVICE,
    codes.ACL_MEMCPY_DEVICE_TO_HOST,
    codes.ACL_MEMCPY_DEVICE_TO_DEVICE,
)
FILL = """
import numpy as np
from simnpu import kernel

@kernel("ptr", "u64", "f32")
def add_all(ctx, x, n, value):
    share = -(-n // ctx.block_num)
    start = ctx.block_idx * share
    count = max(0, min(n, start + share) - start)
    if count:
        view = ctx.gm(x + 4 * start, "float32", count)
        view += value

@kernel("ptr", "u64")
def touch(ctx, x, n):
    ctx.gm(x, "float32", n)[0] = 1
"""


def free_again(acl, free_before: int) -> None:
    """Wait until the device's free memory is back to `free_before`: a client that ended
    leaves when the daemon has closed its session, shortly after its exit."""
    deadline = time.monotonic() + 60
    while acl.rt.get_mem_info(1)[0] != free_before:
        assert time.monotonic() < deadline, "the memory was never freed"
        time.sleep(0.02)


def read(acl, ptr: int, nbytes: int) -> np.ndarray:
    out = np.zeros(nbytes // 4, np.float32)
    assert acl.rt.memcpy(out.ctypes.data, nbytes, ptr, nbytes, D2H) == 0
    return out


def test_granularity_and_properties(acl):
    assert acl.rt.mem_get_allocation_granularity(PROP, 0) == (2 * MiB, 0)
    assert acl.rt.mem_get_allocation_granularity(PROP, 1) == (2 * MiB, 0)
    huge = {**PROP, "mem_attr": codes.ACL_HBM_MEM_HUGE1G}
    assert acl.rt.mem_get_allocation_granularity(huge, 0) == (GiB, 0)
    host_only = {**PROP, "mem_attr": codes.ACL_DDR_MEM_NORMAL}
    assert acl.rt.mem_get_allocation_granularity(host_only, 0)[1] == codes.ACL_ERROR_INVALID_PARAM
    handle, ret = acl.rt.malloc_physical(3 * MiB, PROP, 0)
    assert ret == 0 and handle
    prop, ret = acl.rt.mem_get_allocation_properties_from_handle(handle)
    assert ret == 0 and prop == PROP
    assert acl.rt.free_physical(handle) == 0
    assert acl.rt.free_physical(handle) == codes.ACL_ERROR_RT_PARAM_INVALID


def test_parameter_checks_have_acl_codes(acl):
    invalid, rt_invalid = codes.ACL_ERROR_INVALID_PARAM, codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.reserve_mem_address(0, 0, 0, 0) == (0, invalid)
    assert acl.rt.reserve_mem_address(2 * MiB, 0, 0, 2) == (0, invalid)
    assert acl.rt.reserve_mem_address(2 * MiB, 3, 0, 0) == (0, rt_invalid)
    assert acl.rt.reserve_mem_address_no_uc_memory(GiB, 0, 0, 0) == (
        0,
        codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    )
    assert acl.rt.malloc_physical(0, PROP, 0) == (0, invalid)
    assert acl.rt.malloc_physical(2 * MiB, PROP, 1) == (0, invalid)
    assert acl.rt.malloc_physical(2 * MiB, {**PROP, "handle_type": 2}, 0) == (0, invalid)
    assert acl.rt.malloc_physical(2 * MiB, {**PROP, "mem_attr": 1}, 0) == (0, invalid)
    managed = {**PROP, "location": {"id": 0, "type": codes.ACL_MEM_LOCATION_TYPE_MANAGED}}
    assert acl.rt.malloc_physical(2 * MiB, managed, 0) == (0, invalid)
    host = {**PROP, "location": {"id": 0, "type": codes.ACL_MEM_LOCATION_TYPE_HOST}}
    assert acl.rt.malloc_physical(2 * MiB, host, 0) == (0, codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    elsewhere = {**PROP, "location": {"id": 5, "type": 1}}
    assert acl.rt.malloc_physical(2 * MiB, elsewhere, 0) == (
        0,
        codes.ACL_ERROR_RT_INVALID_DEVICEID,
    )
    assert acl.rt.malloc_physical(512 * MiB, PROP, 0) == (0, codes.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert acl.rt.map_mem(0, 2 * MiB, 0, 1, 0) == invalid
    assert acl.rt.unmap_mem(0) == invalid
    assert acl.rt.release_mem_address(0) == invalid
    assert acl.rt.pointer_get_attributes(0) == ({}, invalid)


def test_map_copy_memset_unmap(acl):
    base, ret = acl.rt.reserve_mem_address(64 * MiB, 0, 0, 0)
    assert ret == 0 and base
    handle, ret = acl.rt.malloc_physical(4 * MiB, PROP, 0)
    assert ret == 0
    # the rules of aclrtMapMem: the whole allocation, offset 0, aligned, inside the range
    assert acl.rt.map_mem(base, 2 * MiB, 0, handle, 0) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.map_mem(base, 4 * MiB, 4096, handle, 0) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.map_mem(base + 4096, 4 * MiB, 0, handle, 0) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.map_mem(base + 62 * MiB, 4 * MiB, 0, handle, 0) == (
        codes.ACL_ERROR_RT_PARAM_INVALID
    )
    assert acl.rt.map_mem(base, 4 * MiB, 0, handle, 1) == codes.ACL_ERROR_INVALID_PARAM
    at = base + 8 * MiB
    assert acl.rt.map_mem(at, 4 * MiB, 0, handle, 0) == 0
    assert acl.rt.map_mem(at + 2 * MiB, 4 * MiB, 0, handle, 0) == (
        codes.ACL_ERROR_RT_PARAM_INVALID
    )  # overlaps the mapping
    data = np.arange(MiB, dtype=np.float32)
    assert acl.rt.memcpy(at, 4 * MiB, data.ctypes.data, 4 * MiB, H2D) == 0
    assert np.array_equal(read(acl, at, 4 * MiB), data)
    assert acl.rt.memset(at + MiB, MiB, 0, MiB) == 0
    expect = data.copy()
    expect[MiB // 4 : MiB // 2] = 0
    assert np.array_equal(read(acl, at, 4 * MiB), expect)
    # asynchronous copies (copy engines) both ways, and device to device
    stream, _ = acl.rt.create_stream()
    other, _ = acl.rt.malloc(4 * MiB, 0)
    assert acl.rt.memcpy_async(other, 4 * MiB, at, 4 * MiB, D2D, stream) == 0
    pinned, _ = acl.rt.malloc_host(4 * MiB)
    assert acl.rt.memcpy_async(pinned, 4 * MiB, at, 4 * MiB, D2H, stream) == 0
    assert acl.rt.memset_async(at, 4 * MiB, 0, 4 * MiB, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(read(acl, other, 4 * MiB), expect)
    assert np.array_equal(np.frombuffer(acl.util.ptr_to_bytes(pinned, 4 * MiB), np.float32), expect)
    assert not read(acl, at, 4 * MiB).any()
    # what the pointer is
    attributes, ret = acl.rt.pointer_get_attributes(at + 100)
    assert ret == 0 and attributes == {"location": {"id": 0, "type": 1}, "page_size": 2 * MiB}
    assert acl.rt.mem_get_address_range(at + 100) == (at, 4 * MiB, 0)
    assert acl.rt.mem_get_address_range(other + 8) == (other, 4 * MiB, 0)
    assert acl.rt.pointer_get_attributes(pinned)[0]["location"]["type"] == 0
    # access: read-write from every device, the only mode simulated
    desc = [{"flags": 3, "location": {"id": 0, "type": 1}}]
    assert acl.rt.mem_set_access(at, 4 * MiB, desc, 1) == 0
    assert acl.rt.mem_get_access(at, {"id": 0, "type": 1}) == (3, 0)
    read_only = [{"flags": 1, "location": {"id": 0, "type": 1}}]
    assert acl.rt.mem_set_access(at, 4 * MiB, read_only, 1) == (
        codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    )
    assert acl.rt.mem_get_access(base, {"id": 0, "type": 1}) == (
        0,
        codes.ACL_ERROR_RT_PARAM_INVALID,
    )
    # an unmapped part of the range is a memory fault naming the range
    assert acl.rt.memset(base, 16, 0, 16) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert f"{base:#x}" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(at + 3 * MiB, 2 * MiB, pinned, 2 * MiB, H2D) == (
        codes.ACL_ERROR_RT_PARAM_INVALID
    )  # runs past the mapped memory
    # the lifetimes: release refused while mapped, free while mapped keeps the memory
    assert acl.rt.release_mem_address(base) == codes.ACL_ERROR_RT_PARAM_INVALID
    retained, ret = acl.rt.mem_retain_allocation_handle(at + MiB)
    assert ret == 0 and retained == handle
    assert acl.rt.free_physical(handle) == 0  # the retained reference keeps the handle
    assert acl.rt.free_physical(handle) == 0  # the mapping keeps the memory
    assert acl.rt.memcpy(at, 4 * MiB, data.ctypes.data, 4 * MiB, H2D) == 0
    assert np.array_equal(read(acl, at, 4 * MiB), data)
    assert acl.rt.unmap_mem(at + MiB) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.unmap_mem(at) == 0
    assert acl.rt.memset(at, 16, 0, 16) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert acl.rt.release_mem_address(base) == 0
    assert acl.rt.release_mem_address(base) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memset(at, 16, 0, 16) == codes.ACL_ERROR_RT_PARAM_INVALID
    for ptr in (other,):
        assert acl.rt.free(ptr) == 0
    assert acl.rt.free_host(pinned) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_growing_a_mapped_range_in_place(acl):
    """An expandable-segments allocator: reserve 1 GiB, map 2 MiB chunks one after another,
    run kernels over the whole mapped part after each growth."""
    binary, ret = acl.rt.binary_load_from_data(FILL.encode(), None)
    assert ret == 0
    add_all, _ = acl.rt.binary_get_function(binary, "add_all")
    add_f32, _ = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
    stream, _ = acl.rt.create_stream()
    base, ret = acl.rt.reserve_mem_address(GiB, 0, 0, 0)
    assert ret == 0
    chunk = 2 * MiB
    handles = []
    for step in range(1, 13):
        handle, ret = acl.rt.malloc_physical(chunk, PROP, 0)
        assert ret == 0
        assert acl.rt.map_mem(base + (step - 1) * chunk, chunk, 0, handle, 0) == 0
        handles.append(handle)
        assert acl.rt.memset(base + (step - 1) * chunk, chunk, 0, chunk) == 0
        n = step * chunk // 4
        args = struct.pack("<QQf", base, n, 1.0)
        # this client's own kernel (its kernel process maps the chunks)
        assert (
            acl.rt.launch_kernel_with_host_args(
                add_all, 3, stream, None, acl.util.bytes_to_ptr(args), len(args)
            )
            == 0
        )
        # a built-in kernel (the AI cores' workers): x + x -> x over the whole part
        builtin = struct.pack("<QQQI", base, base, base, n)
        assert (
            acl.rt.launch_kernel_with_host_args(
                add_f32, 2, stream, None, acl.util.bytes_to_ptr(builtin), len(builtin)
            )
            == 0
        )
        assert acl.rt.synchronize_stream(stream) == 0
        values = read(acl, base, step * chunk)
        # chunk k has been through (step - k) rounds of x -> 2 * (x + 1)
        for k in range(step):
            part = values[k * chunk // 4 : (k + 1) * chunk // 4]
            rounds = step - k
            assert (part == 2 ** (rounds + 1) - 2).all(), (step, k, part[:4])
    # one byte past the mapped part is a fault in the kernel
    touch, _ = acl.rt.binary_get_function(binary, "touch")
    args = struct.pack("<QQ", base, 12 * chunk // 4 + 1)
    assert (
        acl.rt.launch_kernel_with_host_args(
            touch, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert f"[{base:#x}, +{12 * chunk})" in acl.get_recent_err_msg()  # the mapped part
    # a pointer into the range where nothing is mapped: a fault naming the range
    args = struct.pack("<QQ", base + 12 * chunk, 1)
    assert (
        acl.rt.launch_kernel_with_host_args(
            touch, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert f"reserved range [{base:#x}, +{GiB})" in acl.get_recent_err_msg()
    for index, handle in enumerate(handles):
        assert acl.rt.unmap_mem(base + index * chunk) == 0
        assert acl.rt.free_physical(handle) == 0
    assert acl.rt.release_mem_address(base) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_a_mapping_between_others_fits_only_where_nothing_is_mapped(acl):
    """Mappings on both sides: one that runs into the next mapping, one that would cover it
    whole and one that starts inside the previous are refused; one that fits the gap exactly
    is taken; each block is used through its own mapping."""
    rt_invalid = codes.ACL_ERROR_RT_PARAM_INVALID
    base, _ = acl.rt.reserve_mem_address(16 * MiB, 0, 0, 0)
    small = [acl.rt.malloc_physical(2 * MiB, PROP, 0)[0] for _ in range(2)]
    large, _ = acl.rt.malloc_physical(6 * MiB, PROP, 0)
    gap, _ = acl.rt.malloc_physical(4 * MiB, PROP, 0)
    assert acl.rt.map_mem(base, 2 * MiB, 0, small[0], 0) == 0  # [0, 2)
    assert acl.rt.map_mem(base + 6 * MiB, 2 * MiB, 0, small[1], 0) == 0  # [6, 8)
    assert acl.rt.map_mem(base + 4 * MiB, 4 * MiB, 0, gap, 0) == rt_invalid  # into [6, 8)
    assert acl.rt.map_mem(base + 4 * MiB, 6 * MiB, 0, large, 0) == rt_invalid  # over [6, 8)
    assert acl.rt.map_mem(base + 10 * MiB, 6 * MiB, 0, large, 0) == 0  # [10, 16)
    assert acl.rt.map_mem(base, 4 * MiB, 0, gap, 0) == rt_invalid  # over [0, 2)
    assert acl.rt.map_mem(base + 2 * MiB, 4 * MiB, 0, gap, 0) == 0  # [2, 6): the gap exactly
    data = np.arange(2 * MiB, dtype=np.float32)  # 8 MiB: the three mappings side by side
    assert acl.rt.memcpy(base, 8 * MiB, data.ctypes.data, 8 * MiB, H2D) == 0
    assert np.array_equal(read(acl, base, 8 * MiB), data)
    assert acl.rt.memcpy(base + 10 * MiB, 6 * MiB, data.ctypes.data, 6 * MiB, H2D) == 0
    assert np.array_equal(read(acl, base + 10 * MiB, 6 * MiB), data[: 6 * MiB // 4])
    longer = np.zeros(10 * MiB, np.uint8)  # runs past [6, 8) into [8, 10), nothing mapped
    assert acl.rt.memcpy(base, 10 * MiB, longer.ctypes.data, 10 * MiB, H2D) == rt_invalid
    for start, handle in ((0, small[0]), (2, gap), (6, small[1]), (10, large)):
        assert acl.rt.unmap_mem(base + start * MiB) == 0
        assert acl.rt.free_physical(handle) == 0
    assert acl.rt.release_mem_address(base) == 0


def test_physical_memory_counts_and_goes_with_the_client(daemon, acl):
    """Physical memory is the client's memory (memory information, statistics, snapshot,
    quota); a client that ends without freeing leaves nothing behind."""
    from simnpu.client.runtime import Runtime
    from simnpu.client.tools.memory_command import format_snapshot

    code = """
        import acl
        assert acl.rt.set_device(0) == 0
        prop = {"handle_type": 0, "allocation_type": 0, "mem_attr": 4,
                "location": {"id": 0, "type": 1}, "reserve": 0}
        base, ret = acl.rt.reserve_mem_address(1 << 30, 0, 0, 0)
        handle, ret2 = acl.rt.malloc_physical(8 << 20, prop, 0)
        free, total, _ = acl.rt.get_mem_info(1)
        print(ret, ret2, acl.rt.map_mem(base, 8 << 20, 0, handle, 0), total - free, flush=True)
    """
    before, _, _ = acl.rt.get_mem_info(1)
    done = run_client(daemon.address, code)
    ret, ret2, mapped, in_use = map(int, done.stdout.split())
    assert (ret, ret2, mapped) == (0, 0, 0), done.stderr
    assert in_use >= 8 * MiB
    free_again(acl, before)  # the session's end freed it
    rt = Runtime(daemon.address)
    try:
        rt.contexts.set_device(0)
        base = rt.vmm.reserve_mem_address(4 * MiB)
        handle = rt.vmm.malloc_physical(2 * MiB, PROP)
        rt.vmm.map_mem(base + 2 * MiB, 2 * MiB, 0, handle)
        stats = rt.memory.memory_stats()
        assert stats["allocated_bytes.all.current"] >= 2 * MiB
        snapshot = rt.memory.memory_snapshot()
        [block] = [b for b in snapshot if "physical" in b]
        assert block["physical"] == {"handle_references": 1, "mapped_at": [base + 2 * MiB]}
        assert f"physical, mapped at {base + 2 * MiB:#x}" in format_snapshot(snapshot)
        rt.memory.set_memory_limit(4 * MiB)  # its quota counts physical memory
        with pytest.raises(NpuError) as refused:
            rt.vmm.malloc_physical(2 * MiB, PROP)
        assert refused.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    finally:
        rt.close()
    free_again(acl, before)


def test_bad_input_does_not_harm_the_daemon(acl):
    size, huge = 2 * MiB, 1 << 63
    rt_invalid, oom = codes.ACL_ERROR_RT_PARAM_INVALID, codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    assert acl.rt.reserve_mem_address(huge, 0, 0, 0) == (0, oom)
    assert acl.rt.reserve_mem_address(600 * GiB, 0, 0, 0) == (0, oom)  # the reserved half
    assert acl.rt.reserve_mem_address(size, huge, 0, 0) == (0, rt_invalid)
    assert acl.rt.reserve_mem_address(size, 0, 4096, 0) == (0, rt_invalid)  # not a device's
    assert acl.rt.malloc_physical(huge, PROP, 0) == (0, oom)
    assert acl.rt.malloc_physical(size, "prop", 0) == (0, codes.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.malloc_physical(size, {**PROP, "location": "x"}, 0)[1] == (
        codes.ACL_ERROR_INVALID_PARAM
    )
    base, _ = acl.rt.reserve_mem_address(size, 0, 0, 0)
    handle, _ = acl.rt.malloc_physical(size, PROP, 0)
    assert acl.rt.map_mem(base, huge, 0, handle, 0) == rt_invalid
    assert acl.rt.map_mem(base, size, huge, handle, 0) == rt_invalid
    assert acl.rt.map_mem(base, size, 0, handle + 1, 0) == rt_invalid
    assert acl.rt.map_mem(base + size, size, 0, handle, 0) == rt_invalid
    assert acl.rt.mem_get_access(base, "x") == (0, rt_invalid)
    assert acl.rt.mem_get_address_range((1 << 64) - 1) == (0, 0, rt_invalid)
    assert acl.rt.map_mem(base, size, 0, handle, 0) == 0
    assert acl.rt.free_physical(handle) == 0
    assert acl.rt.unmap_mem(base) == 0
    assert acl.rt.release_mem_address(base) == 0
    ptr, ret = acl.rt.malloc(64, 0)
    assert ret == 0 and acl.rt.free(ptr) == 0


def test_another_clients_ranges_are_not_this_ones(daemon, acl):
    """A reserved or mapped address of another process is no memory of this one: 107000,
    not even the fault that names a range of its own."""
    base, _ = acl.rt.reserve_mem_address(2 * MiB, 0, 0, 0)
    handle, _ = acl.rt.malloc_physical(2 * MiB, PROP, 0)
    assert acl.rt.map_mem(base, 2 * MiB, 0, handle, 0) == 0
    code = f"""
        import acl
        acl.rt.set_device(0)
        print(acl.rt.memset({base}, 16, 0, 16), acl.rt.unmap_mem({base}),
              acl.rt.release_mem_address({base}), acl.rt.mem_retain_allocation_handle({base})[1])
    """
    other = run_client(daemon.address, code)
    invalid = str(codes.ACL_ERROR_RT_PARAM_INVALID)
    assert other.stdout.split() == [invalid] * 4, other.stderr
    assert acl.rt.unmap_mem(base) == 0
    assert acl.rt.free_physical(handle) == 0
    assert acl.rt.release_mem_address(base) == 0


def test_work_queued_before_an_unmap_runs_on_the_old_pages(acl):
    """ACL's unmap does not wait for tasks: a memset queued before it and run after it is
    the program's use after unmap; it touches the old pages (as after aclrtFree), the
    copy engine carries on and the stream completes."""
    binary, _ = acl.rt.binary_load_from_data(GATE.encode(), None)
    gate, _ = acl.rt.binary_get_function(binary, "gate")
    flag, _ = acl.rt.malloc(4, 0)
    assert acl.rt.memset(flag, 4, 0, 4) == 0
    stream, _ = acl.rt.create_stream()
    base, _ = acl.rt.reserve_mem_address(2 * MiB, 0, 0, 0)
    handle, _ = acl.rt.malloc_physical(2 * MiB, PROP, 0)
    assert acl.rt.map_mem(base, 2 * MiB, 0, handle, 0) == 0
    args = struct.pack("<Qd", flag, 60.0)
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.memset_async(base, 2 * MiB, 1, 2 * MiB, stream) == 0
    assert acl.rt.unmap_mem(base) == 0
    assert acl.rt.free_physical(handle) == 0
    assert acl.rt.release_mem_address(base) == 0
    assert acl.rt.memset(flag, 4, 1, 4) == 0  # open the gate
    assert acl.rt.synchronize_stream(stream) == 0, acl.get_recent_err_msg()
    ptr, _ = acl.rt.malloc(4 * MiB, 0)  # the device works on
    assert acl.rt.memset(ptr, 4 * MiB, 0, 4 * MiB) == 0
    assert not read(acl, ptr, 4 * MiB).any()
    for done in (acl.rt.free(ptr), acl.rt.free(flag), acl.rt.destroy_stream(stream)):
        assert done == 0
