"""acl.rt device queries and resource limits, acl.sys versions, CANN attributes, data
buffers, memory helpers (memset_d32, free_with_dev_sync, check_mem_type, mem_pool_trim_to)
and host-function threads, through `acl` against a real daemon (1 device, 2 AI cores)."""

from __future__ import annotations

import struct
import threading

import numpy as np

CORES = """
from simnpu import kernel

@kernel("ptr")
def which_core(ctx, out):
    ctx.gm(out + 4 * ctx.block_idx, "uint32", 1)[0] = ctx.core_id
"""
BLOCKS = 64


def test_soc_name_and_versions_say_the_device_is_simulated(acl):
    assert acl.get_soc_name() == acl.rt.get_soc_name() == "simnpu-simulated-npu"
    assert acl.rt.check_arch_compatibility("simnpu-simulated-npu") == (1, 0)
    assert acl.rt.check_arch_compatibility("Ascend910B1") == (0, 0)
    assert acl.rt.check_arch_compatibility("") == (0, acl.ACL_ERROR_INVALID_PARAM)
    version, ret = acl.sys.get_version_str("runtime")
    assert ret == 0 and version == acl.sys.get_version_str("simnpu")[0]
    major, minor, patch, ret = acl.get_version()
    assert ret == 0 and version.startswith(f"{major}.{minor}.{patch}")
    assert acl.sys.get_version_num("runtime") == (
        major * 10_000_000 + minor * 100_000 + patch * 1_000,
        0,
    )
    assert acl.sys.get_version_str("driver") == ("", acl.ACL_ERROR_INVALID_FILE)
    assert acl.sys.get_version_num("") == (0, acl.ACL_ERROR_INVALID_PARAM)


def test_the_deprecated_cann_version_call_gives_the_same_version(acl):
    version, ret = acl.sys.get_cann_version(acl.ACL_PKG_NAME_CANN)
    assert ret == 0 and acl.sys.get_cann_version(acl.ACL_PKG_NAME_RUNTIME) == (version, 0)
    assert version["version"] == acl.sys.get_version_str("runtime")[0]
    major, minor, patch, _ = acl.get_version()
    assert (version["major_version"], version["minor_version"]) == (str(major), str(minor))
    assert version["release_version"] == str(patch) and version["patch_version"] == "0"
    assert acl.sys.get_cann_version(acl.ACL_PKG_NAME_DRIVER) == ({}, acl.ACL_ERROR_INVALID_FILE)
    assert "not installed" in acl.get_recent_err_msg()
    assert acl.sys.get_cann_version(8) == ({}, acl.ACL_ERROR_INVALID_PARAM)
    assert acl.sys.get_cann_version(-1) == ({}, acl.ACL_ERROR_INVALID_PARAM)


def test_cann_attributes(acl):
    attributes, ret = acl.get_cann_attribute_list()
    assert ret == 0
    # Only the supported attributes are listed, as the runtime lists them.
    assert attributes == [acl.ACL_CANN_ATTR_INF_NAN]
    assert acl.get_cann_attribute(acl.ACL_CANN_ATTR_INF_NAN) == (1, 0)
    assert acl.get_cann_attribute(acl.ACL_CANN_ATTR_BF16) == (0, 0)
    assert acl.get_cann_attribute(acl.ACL_CANN_ATTR_JIT_COMPILE) == (0, 0)
    assert acl.get_cann_attribute(acl.ACL_CANN_ATTR_UNDEFINED) == (0, acl.ACL_ERROR_INVALID_PARAM)


def test_device_info_status_capability_and_utilization(acl):
    assert acl.rt.get_device_info(0, acl.ACL_DEV_ATTR_AICORE_CORE_NUM) == (2, 0)
    assert acl.rt.get_device_info(0, acl.ACL_DEV_ATTR_CUBE_CORE_NUM) == (2, 0)
    assert acl.rt.get_device_info(0, acl.ACL_DEV_ATTR_VECTOR_CORE_NUM) == (2, 0)
    total, ret = acl.rt.get_device_info(0, acl.ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE)
    assert ret == 0 and total == acl.rt.get_mem_info(acl.ACL_HBM_MEM)[1]
    assert acl.rt.get_device_info(0, acl.ACL_DEV_ATTR_L2_CACHE_SIZE) == (
        0,
        acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    )
    assert "simulated NPU" in acl.get_recent_err_msg()
    assert acl.rt.get_device_info(0, 99999) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.get_device_info(7, acl.ACL_DEV_ATTR_AICORE_CORE_NUM) == (
        0,
        acl.ACL_ERROR_RT_INVALID_DEVICEID,
    )
    assert acl.rt.query_device_status(0) == (acl.ACL_RT_DEVICE_STATUS_NORMAL, 0)
    assert acl.rt.query_device_status(-1) == (
        acl.ACL_RT_DEVICE_STATUS_END,
        acl.ACL_ERROR_RT_INVALID_DEVICEID,
    )
    assert acl.rt.get_device_capability(0, acl.ACL_FEATURE_SYSTEM_MEMQ_EVENT_CROSS_DEV) == (0, 0)
    assert acl.rt.get_device_capability(0, 5) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    info, ret = acl.rt.get_device_utilization_rate(0)
    assert ret == 0
    assert set(info) == {
        "cube_utilization",
        "vector_utilization",
        "aicpu_utilization",
        "memory_utilization",
    }
    assert 0 <= info["cube_utilization"] <= 100
    assert info["aicpu_utilization"] == info["memory_utilization"] == -1
    assert acl.rt.get_device_utilization_rate(3) == ({}, acl.ACL_ERROR_RT_INVALID_DEVICEID)


def _cores_used(acl, function, stream) -> set[int]:
    out, _ = acl.rt.malloc(4 * BLOCKS, 0)
    args = struct.pack("<Q", out)
    assert (
        acl.rt.launch_kernel_with_host_args(
            function, BLOCKS, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.synchronize_stream(stream) == 0
    host = bytes(4 * BLOCKS)
    assert (
        acl.rt.memcpy(
            acl.util.bytes_to_ptr(host), len(host), out, len(host), acl.ACL_MEMCPY_DEVICE_TO_HOST
        )
        == 0
    )
    assert acl.rt.free(out) == 0
    return set(np.frombuffer(host, dtype=np.uint32).tolist())


def test_resource_limits_are_enforced(acl):
    binary, _ = acl.rt.binary_load_from_data(CORES)
    function, _ = acl.rt.binary_get_function(binary, "which_core")
    stream, _ = acl.rt.create_stream()
    cube, vector = acl.ACL_RT_DEV_RES_CUBE_CORE, acl.ACL_RT_DEV_RES_VECTOR_CORE
    assert acl.rt.get_device_res_limit(0, cube) == (2, 0)
    assert acl.rt.set_device_res_limit(0, vector, 1) == 0
    assert acl.rt.get_device_res_limit(0, vector) == (1, 0)
    assert acl.rt.get_device_res_limit(0, cube) == (2, 0)
    assert acl.rt.get_res_in_current_thread(vector) == (1, 0)
    for _ in range(3):
        assert len(_cores_used(acl, function, stream)) == 1
    assert acl.rt.set_device_res_limit(0, cube, 0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.set_device_res_limit(0, cube, 3) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.set_device_res_limit(0, 2, 1) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.set_device_res_limit(1, cube, 1) == acl.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.get_device_res_limit(0, 9) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.reset_device_res_limit(0) == 0
    assert acl.rt.get_device_res_limit(0, vector) == (2, 0)
    assert _cores_used(acl, function, stream) <= {0, 1}
    assert acl.rt.reset_device_res_limit(4) == acl.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.binary_unload(binary) == 0


def test_data_buffers(acl):
    buffer = acl.create_data_buffer(0x1234, 100)
    assert buffer != 0
    assert acl.get_data_buffer_addr(buffer) == 0x1234
    assert acl.get_data_buffer_size_v2(buffer) == 100
    assert acl.get_data_buffer_size(buffer) == 100
    assert acl.update_data_buffer(buffer, 0x5678, 2**33) == 0
    assert acl.get_data_buffer_size_v2(buffer) == 2**33
    assert acl.get_data_buffer_size(buffer) == 0  # the deprecated uint32 form truncates
    assert acl.get_data_buffer_addr(buffer) == 0x5678
    assert acl.destroy_data_buffer(buffer) == 0
    assert acl.destroy_data_buffer(buffer) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.destroy_data_buffer(0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.update_data_buffer(0, 1, 1) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.get_data_buffer_addr(0) == acl.get_data_buffer_size_v2(buffer) == 0
    assert acl.create_data_buffer(0, -1) == 0
    empty = acl.create_data_buffer(0, 0)
    assert empty != 0 and acl.destroy_data_buffer(empty) == 0


def test_memset_d32(acl):
    stream, _ = acl.rt.create_stream()
    ptr, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset_d32(ptr, 64, 0xDEADBEEF, 16) == 0
    assert acl.rt.memset_d32_async(ptr + 8, 56, 7, 2, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    host = bytes(64)
    assert (
        acl.rt.memcpy(acl.util.bytes_to_ptr(host), 64, ptr, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    )
    words = np.frombuffer(host, dtype=np.uint32).tolist()
    assert words == [0xDEADBEEF] * 2 + [7] * 2 + [0xDEADBEEF] * 12
    assert acl.rt.memset_d32(ptr, 64, 1, 0) == 0  # N == 0: nothing to do
    assert acl.rt.memset_d32(0, 64, 1, 1) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memset_d32(ptr + 2, 60, 1, 1) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memset_d32(ptr, 7, 1, 2) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memset_d32(ptr, 128, 1, 32) == acl.ACL_ERROR_RT_PARAM_INVALID  # past the block
    assert acl.rt.memset_d32_async(ptr, 64, 1, 1, 0xBAD) == acl.ACL_ERROR_RT_INVALID_HANDLE
    pinned, _ = acl.rt.malloc_host(16)
    assert acl.rt.memset_d32(pinned, 16, 0x01020304, 4) == 0
    assert acl.util.ptr_to_bytes(pinned, 16) == bytes([4, 3, 2, 1]) * 4
    assert acl.rt.free_host_with_dev_sync(pinned) == 0
    assert acl.rt.free_host_with_dev_sync(pinned) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free_with_dev_sync(ptr) == 0
    assert acl.rt.free_with_dev_sync(ptr) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free_with_dev_sync(0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.destroy_stream(stream) == 0


def test_check_mem_type(acl):
    ptr, _ = acl.rt.malloc(4096, 0)
    host = bytes(8)
    dev, dvpp, rsvd = acl.ACL_RT_MEM_TYPE_DEV, acl.ACL_RT_MEM_TYPE_DVPP, acl.ACL_RT_MEM_TYPE_RSVD
    assert acl.rt.check_mem_type([ptr, ptr + 100], dev, 0) == (1, 0)
    assert acl.rt.check_mem_type([ptr], dev | dvpp, 0) == (1, 0)
    assert acl.rt.check_mem_type([ptr, acl.util.bytes_to_ptr(host)], dev, 0) == (0, 0)
    assert acl.rt.check_mem_type([ptr], rsvd, 0) == (0, 0)
    assert acl.rt.check_mem_type([ptr], 0, 0) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.check_mem_type([ptr], 0x40, 0) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.check_mem_type([ptr], dev, 1) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.check_mem_type([], dev, 0) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.free(ptr) == 0
    assert acl.rt.check_mem_type([ptr], dev, 0) == (0, 0)


def test_mem_pool_trim_to(acl):
    pool, ret = acl.rt.mem_pool_create({"max_size": 0, "location": {"id": 0}})
    assert ret == 0
    assert acl.rt.mem_pool_trim_to(pool, 0) == 0
    assert acl.rt.mem_pool_trim_to(pool, 1 << 20) == 0
    assert acl.rt.mem_pool_trim_to(0xBAD, 0) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.mem_pool_destroy(pool) == 0
    assert acl.rt.mem_pool_trim_to(pool, 0) == acl.ACL_ERROR_RT_INVALID_HANDLE


def test_host_functions_run_on_the_subscribed_thread(acl):
    context, _ = acl.rt.get_context()
    stream, _ = acl.rt.create_stream()
    ran, results = [], []
    stop = threading.Event()

    def loop(ctx):
        results.append(acl.rt.set_context(ctx))
        while not stop.is_set():
            results.append(acl.rt.process_host_func(20))

    thread_id, _ = acl.util.start_thread(loop, context)
    assert acl.rt.subscribe_host_func(thread_id, stream) == 0
    assert acl.rt.subscribe_host_func(thread_id, stream) == acl.ACL_ERROR_REPEAT_SUBSCRIBE
    for label in ("first", "second"):
        assert (
            acl.rt.launch_host_func(stream, lambda d: ran.append((d, threading.get_ident())), label)
            == 0
        )
    assert acl.rt.synchronize_stream(stream) == 0
    assert ran == [("first", thread_id), ("second", thread_id)]
    assert acl.rt.unsubscribe_host_func(thread_id, stream) == 0
    assert acl.rt.unsubscribe_host_func(thread_id, stream) == acl.ACL_ERROR_STREAM_NOT_SUBSCRIBE
    assert acl.rt.launch_host_func(stream, lambda d: ran.append((d, threading.get_ident())), 3) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert ran[-1][0] == 3 and ran[-1][1] != thread_id  # the runtime's own thread again
    stop.set()
    assert acl.util.stop_thread(thread_id) == 0
    assert results[0] == 0
    # 107012 while the loop ran before the subscription (at once, as for process_report)
    assert set(results[1:]) <= {
        0,
        acl.ACL_ERROR_RT_REPORT_TIMEOUT,
        acl.ACL_ERROR_RT_THREAD_SUBSCRIBE,
    }
    assert acl.rt.process_host_func(10) == acl.ACL_ERROR_RT_THREAD_SUBSCRIBE
    assert acl.rt.process_host_func(0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.subscribe_host_func(1, 0xBAD) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.destroy_stream(stream) == 0
