"""Managed memory against a real daemon: usable at one pointer from the host and from
kernels, freed with aclrtFree; the codes for bad input; another client cannot reach it; a
client killed holding it leaves nothing behind. Its advice, prefetches and range
attributes: each call and attribute, prefetches in stream order, codes, free and session
end."""

from __future__ import annotations

import ctypes
import signal
import struct
import time

import numpy as np
from conftest import GATE, run_client, simnpu_segments, start_client

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


# ---- advice, prefetches, range attributes ------------------------------------------------------
MIB = 1 << 20
DEVICE0 = {"type": codes.ACL_MEM_LOCATIONTYPE_DEVICE, "id": 0}
HOST = {"type": codes.ACL_MEM_LOCATIONTYPE_HOST, "id": 0}
NUMA0 = {"type": codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA, "id": 0}
READ_MOSTLY = codes.ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY
PREFERRED = codes.ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION
ACCESSED_BY = codes.ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY
PREFERRED_TYPE = codes.ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE
PREFERRED_ID = codes.ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID
LAST = codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION
LAST_TYPE = codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE
LAST_ID = codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID
PARAM, RT_PARAM = codes.ACL_ERROR_INVALID_PARAM, codes.ACL_ERROR_RT_PARAM_INVALID


def last(acl, ptr: int, size: int) -> list[int]:
    values, ret = acl.rt.mem_managed_get_attrs([LAST, LAST_TYPE, LAST_ID], ptr, size, [4, 4, 4])
    assert ret == 0
    return values


def test_advice_is_recorded_per_byte_range(acl):
    ptr, _ = acl.rt.mem_alloc_managed(4 * MIB, GLOBAL)
    get = acl.rt.mem_managed_get_attr
    # nothing advised: read-mostly 0, no preferred location, nobody accessing
    assert get(READ_MOSTLY, ptr, 4 * MIB, 4) == (0, 0)
    assert get(PREFERRED, ptr, 4 * MIB, 4) == (-2, 0)
    assert get(PREFERRED_TYPE, ptr, 4 * MIB, 4) == (codes.ACL_MEM_LOCATIONTYPE_INVALID, 0)
    assert get(PREFERRED_ID, ptr, 4 * MIB, 4) == (-2, 0)
    assert get(ACCESSED_BY, ptr, 4 * MIB, 8) == ([-2, -2], 0)
    # read-mostly on the first 2 MiB: the whole range does not agree, its halves do
    assert acl.rt.mem_managed_advise(ptr, 2 * MIB, 0, {"type": 0, "id": 0}) == 0
    assert get(READ_MOSTLY, ptr, 2 * MIB, 4) == (1, 0)
    assert get(READ_MOSTLY, ptr + MIB, 2 * MIB, 4) == (0, 0)
    assert get(READ_MOSTLY, ptr + 2 * MIB, 2 * MIB, 4) == (0, 0)
    assert acl.rt.mem_managed_advise(ptr + MIB, MIB, 1, HOST) == 0  # unset in the middle
    assert get(READ_MOSTLY, ptr, MIB, 4) == (1, 0)
    assert get(READ_MOSTLY, ptr, 2 * MIB, 4) == (0, 0)
    # preferred location: a device, the host, a NUMA node; -2 where the range disagrees
    assert acl.rt.mem_managed_advise(ptr, 2 * MIB, 2, DEVICE0) == 0
    assert acl.rt.mem_managed_advise(ptr + 2 * MIB, MIB, 2, HOST) == 0
    assert acl.rt.mem_managed_advise(ptr + 3 * MIB, MIB, 2, NUMA0) == 0
    assert get(PREFERRED, ptr, 2 * MIB, 4) == (0, 0)
    assert get(PREFERRED_TYPE, ptr, 2 * MIB, 4) == (codes.ACL_MEM_LOCATIONTYPE_DEVICE, 0)
    assert get(PREFERRED_ID, ptr, 2 * MIB, 4) == (0, 0)
    assert get(PREFERRED, ptr + 2 * MIB, MIB, 4) == (-1, 0)
    assert get(PREFERRED_TYPE, ptr + 2 * MIB, 4096, 4) == (codes.ACL_MEM_LOCATIONTYPE_HOST, 0)
    assert get(PREFERRED_ID, ptr + 2 * MIB, MIB, 4) == (-2, 0)
    assert get(PREFERRED_TYPE, ptr + 3 * MIB, MIB, 4) == (codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA, 0)
    assert get(PREFERRED_ID, ptr + 3 * MIB, MIB, 4) == (0, 0)
    assert get(PREFERRED, ptr, 4 * MIB, 4) == (-2, 0)
    assert get(PREFERRED_TYPE, ptr, 4 * MIB, 4) == (codes.ACL_MEM_LOCATIONTYPE_INVALID, 0)
    assert acl.rt.mem_managed_advise(ptr, 4 * MIB, 3, {}) == 0  # unset: the location is ignored
    assert get(PREFERRED, ptr, 4 * MIB, 4) == (-2, 0)
    # accessed-by: the locations that advised the whole range, padded with -2 or cut
    assert acl.rt.mem_managed_advise(ptr, 4 * MIB, 4, DEVICE0) == 0
    assert acl.rt.mem_managed_advise(ptr, MIB, 4, HOST) == 0
    assert get(ACCESSED_BY, ptr, MIB, 12) == ([0, -1, -2], 0)
    assert get(ACCESSED_BY, ptr, MIB, 4) == ([0], 0)
    assert get(ACCESSED_BY, ptr, 4 * MIB, 8) == ([0, -2], 0)
    assert acl.rt.mem_managed_advise(ptr, 4 * MIB, 5, DEVICE0) == 0
    assert get(ACCESSED_BY, ptr, MIB, 8) == ([-1, -2], 0)
    # get_attrs answers several at once, in order
    assert acl.rt.mem_managed_get_attrs(
        [READ_MOSTLY, ACCESSED_BY, PREFERRED], ptr, MIB, [4, 8, 4]
    ) == ([1, [-1, -2], -2], 0)
    assert acl.rt.free(ptr) == 0


def test_prefetch_is_a_task_of_its_stream(acl):
    ptr, _ = acl.rt.mem_alloc_managed(4 * MIB, GLOBAL)
    binary, _ = acl.rt.binary_load_from_data(GATE, None)
    gate, _ = acl.rt.binary_get_function(binary, "gate")
    flag, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset(flag, 64, 0, 64) == 0
    stream, _ = acl.rt.create_stream()
    args = struct.pack("<Qd", flag, 120.0)
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.mem_managed_prefetch_async(ptr, 4 * MIB, DEVICE0, 0, stream) == 0
    # the batch form: the first two ranges to the host, the third to device 0
    ptrs, sizes = [ptr, ptr + MIB, ptr + 3 * MIB], [MIB, MIB, MIB]
    assert (
        acl.rt.mem_managed_prefetch_batch_async(
            ptrs, sizes, 3, [HOST, DEVICE0], [0, 2], 2, 0, stream
        )
        == 0
    )
    # the gate holds the stream: nothing was prefetched yet
    assert last(acl, ptr, 4 * MIB) == [-2, codes.ACL_MEM_LOCATIONTYPE_INVALID, -2]
    assert acl.rt.stream_query(stream) == (1, 0)  # ACL_STREAM_STATUS_NOT_READY
    one = struct.pack("<i", 1)
    assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    host = [-1, codes.ACL_MEM_LOCATIONTYPE_HOST, -2]
    device = [0, codes.ACL_MEM_LOCATIONTYPE_DEVICE, 0]
    assert last(acl, ptr, 2 * MIB) == host
    assert last(acl, ptr + 2 * MIB, MIB) == device  # the single prefetch's, untouched by the batch
    assert last(acl, ptr + 3 * MIB, MIB) == device
    assert last(acl, ptr, 4 * MIB) == [-2, codes.ACL_MEM_LOCATIONTYPE_INVALID, -2]
    # the current thread's NUMA node, on the default stream
    numa_current = {"type": codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT, "id": 7}
    assert acl.rt.mem_managed_prefetch_async(ptr, MIB, numa_current, 0, 0) == 0
    assert acl.rt.synchronize_stream(0) == 0
    assert last(acl, ptr, MIB) == [0, codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA, 0]
    # a prefetch queued behind the gate and freed before it runs records nothing, harms nothing
    assert acl.rt.memset(flag, 64, 0, 64) == 0
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.mem_managed_prefetch_async(ptr, MIB, HOST, 0, stream) == 0
    assert acl.rt.free(ptr) == 0
    assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    fresh, _ = acl.rt.mem_alloc_managed(MIB, GLOBAL)  # advice never outlives its memory
    assert last(acl, fresh, MIB) == [-2, codes.ACL_MEM_LOCATIONTYPE_INVALID, -2]
    assert acl.rt.free(fresh) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(flag) == 0
    assert acl.rt.binary_unload(binary) == 0


def test_codes_of_bad_advice_prefetches_and_queries(acl):
    ptr, _ = acl.rt.mem_alloc_managed(2 * MIB, GLOBAL)
    device, _ = acl.rt.malloc(4096, 0)
    advise, get = acl.rt.mem_managed_advise, acl.rt.mem_managed_get_attr
    gets = acl.rt.mem_managed_get_attrs
    count, _ = acl.rt.get_device_count()
    # ACL's own checks
    assert advise(0, MIB, 0, DEVICE0) == PARAM
    assert advise(ptr, 0, 0, DEVICE0) == PARAM
    assert advise(ptr, MIB, 0, 5) == PARAM  # location not a dict
    assert get(READ_MOSTLY, 0, MIB, 4) == (0, PARAM)
    assert get(READ_MOSTLY, ptr, 0, 4) == (0, PARAM)
    assert acl.rt.mem_managed_prefetch_async(ptr, MIB, DEVICE0, 1, 0) == PARAM
    assert acl.rt.mem_managed_prefetch_async(0, MIB, DEVICE0, 0, 0) == PARAM
    # the runtime's and the driver's
    assert advise(ptr, MIB, 6, DEVICE0) == RT_PARAM
    assert advise(ptr, MIB, 2, {"type": 1, "id": count}) == RT_PARAM
    assert advise(ptr, MIB, 2, {"type": 1, "id": -1}) == RT_PARAM
    assert advise(ptr, MIB, 2, {"type": 0, "id": 0}) == RT_PARAM  # an invalid location
    assert advise(ptr, MIB, 4, {"type": 9, "id": 0}) == RT_PARAM
    assert advise(ptr, MIB, 2, {"type": 3, "id": 5}) == RT_PARAM  # no such NUMA node
    assert advise(ptr, 2 * MIB + 1, 0, DEVICE0) == RT_PARAM  # past the end
    assert advise(device, 4096, 0, DEVICE0) == RT_PARAM  # device memory is not managed
    assert advise(ptr - 4096, 4096, 0, DEVICE0) == RT_PARAM
    assert get(0, ptr, MIB, 4) == (0, RT_PARAM)
    assert get(9, ptr, MIB, 4) == (0, RT_PARAM)
    assert get(READ_MOSTLY, ptr, MIB, 8) == (0, RT_PARAM)  # a 4-byte value
    assert get(ACCESSED_BY, ptr, MIB, 6) == (0, RT_PARAM)  # not a multiple of 4
    assert get(READ_MOSTLY, ptr, 2 * MIB + 1, 4) == (0, RT_PARAM)
    assert gets([READ_MOSTLY, 9], ptr, MIB, [4, 4]) == ([], RT_PARAM)
    assert gets([READ_MOSTLY], ptr, MIB, [4, 4]) == ([], PARAM)
    prefetch = acl.rt.mem_managed_prefetch_async
    assert prefetch(ptr, MIB, {"type": 0, "id": 0}, 0, 0) == RT_PARAM
    assert prefetch(ptr, MIB, {"type": 1, "id": count}, 0, 0) == RT_PARAM
    assert prefetch(device, 4096, DEVICE0, 0, 0) == RT_PARAM
    assert prefetch(ptr, MIB, DEVICE0, 0, 0x1234) == codes.ACL_ERROR_RT_INVALID_HANDLE
    batch = acl.rt.mem_managed_prefetch_batch_async
    assert batch([ptr], [MIB], 0, [HOST], [0], 1, 0, 0) == PARAM  # count 0
    assert batch([ptr], [MIB], 1, [HOST, HOST], [0, 1], 2, 0, 0) == PARAM  # more locations
    assert batch([ptr], [MIB], 1, [HOST], [0], 1, 1, 0) == PARAM  # flags
    assert batch([ptr], [MIB], 2, [HOST], [0], 1, 0, 0) == PARAM  # lists shorter than count
    two = [ptr, ptr + MIB]
    assert batch(two, [MIB, MIB], 2, [HOST], [1], 1, 0, 0) == RT_PARAM  # first index not 0
    assert batch(two, [MIB, MIB], 2, [HOST, HOST], [0, 0], 2, 0, 0) == RT_PARAM  # not rising
    assert batch([ptr, 0], [MIB, MIB], 2, [HOST], [0], 1, 0, 0) == RT_PARAM  # a null pointer
    assert batch(two, [MIB, 2 * MIB], 2, [HOST], [0], 1, 0, 0) == RT_PARAM  # past the end
    assert batch(two, [MIB, MIB], 2, [HOST], [0], 1, 0, 0x1234) == codes.ACL_ERROR_RT_INVALID_HANDLE
    # nothing failed was recorded, and the session works on
    assert last(acl, ptr, 2 * MIB) == [-2, codes.ACL_MEM_LOCATIONTYPE_INVALID, -2]
    assert get(READ_MOSTLY, ptr, 2 * MIB, 4) == (0, 0)
    assert acl.rt.synchronize_stream(0) == 0
    assert acl.rt.free(device) == 0
    assert acl.rt.free(ptr) == 0
    # freed: no longer managed memory
    assert advise(ptr, MIB, 0, DEVICE0) == RT_PARAM
    assert get(READ_MOSTLY, ptr, MIB, 4) == (0, RT_PARAM)


def test_another_clients_managed_memory_is_refused(acl, daemon):
    ptr, _ = acl.rt.mem_alloc_managed(2 * MIB, GLOBAL)
    assert acl.rt.mem_managed_advise(ptr, MIB, 0, DEVICE0) == 0
    code = f"""
    import acl
    acl.init(); acl.rt.set_device(0)
    location = {{"type": 1, "id": 0}}
    print(acl.rt.mem_managed_advise({ptr}, {MIB}, 1, location))
    print(acl.rt.mem_managed_get_attr(1, {ptr}, {MIB}, 4)[1])
    print(acl.rt.mem_managed_prefetch_async({ptr}, {MIB}, location, 0, 0))
    print(acl.rt.synchronize_stream(0))
    """
    done = run_client(daemon.address, code)
    rt_param = str(RT_PARAM)
    assert done.stdout.split() == [rt_param, rt_param, rt_param, "0"], done.stderr
    assert acl.rt.mem_managed_get_attr(READ_MOSTLY, ptr, MIB, 4) == (1, 0)  # untouched
    assert acl.rt.free(ptr) == 0


def test_a_session_that_ends_with_advice_and_prefetches_queued(acl, daemon):
    before = set(simnpu_segments())
    code = """
    import acl
    acl.init(); acl.rt.set_device(0)
    ptr, _ = acl.rt.mem_alloc_managed(1 << 21, 1)
    location = {"type": 1, "id": 0}
    print(acl.rt.mem_managed_advise(ptr, 1 << 21, 2, location))
    print(acl.rt.mem_managed_prefetch_async(ptr, 1 << 21, location, 0, 0))
    acl.rt.reset_device(0)
    acl.finalize()
    """
    done = run_client(daemon.address, code)
    assert done.returncode == 0 and done.stdout.split() == ["0", "0"], done.stderr
    deadline = time.monotonic() + 60
    while set(simnpu_segments()) - before:
        assert time.monotonic() < deadline, "the managed memory outlived its session"
        time.sleep(0.05)
    ptr, ret = acl.rt.mem_alloc_managed(MIB, GLOBAL)
    assert ret == 0
    assert acl.rt.mem_managed_get_attr(PREFERRED, ptr, MIB, 4) == (-2, 0)
    assert acl.rt.free(ptr) == 0
