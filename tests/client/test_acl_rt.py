"""acl.rt against a real daemon: return shapes, the real codes of error paths, argument types.

This process is the pyACL program (acl.init ... acl.finalize around each test)."""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest

MiB = 1 << 20
TOTAL = 256 * MiB  # the `daemon` fixture's memory


def host_view(ptr, nbytes, dtype=np.uint8):
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype)


# ---- shapes --------------------------------------------------------------------------------------
def test_return_shapes(acl):
    assert acl.rt.get_device() == (0, 0)
    assert acl.rt.get_device_count() == (1, 0)
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0) == (1, 0)
    assert acl.rt.device_get_stream_priority_range() == (7, 0, 0)
    context, ret = acl.rt.get_context()
    assert ret == 0 and isinstance(context, int) and context
    default, ret = acl.rt.ctx_get_current_default_stream()
    assert ret == 0 and isinstance(default, int) and default
    stream, ret = acl.rt.create_stream()
    assert ret == 0 and isinstance(stream, int) and stream
    assert acl.rt.stream_query(stream) == (acl.ACL_STREAM_STATUS_COMPLETE, 0)
    event, ret = acl.rt.create_event()
    assert ret == 0 and isinstance(event, int)
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.synchronize_event(event) == 0
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    assert acl.rt.query_event(event) == (acl.ACL_EVENT_STATUS_COMPLETE, 0)
    ms, ret = acl.rt.event_elapsed_time(event, event)
    assert ret == 0 and isinstance(ms, float) and ms == 0.0
    ptr, ret = acl.rt.malloc(4096, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == 0 and isinstance(ptr, int) and ptr
    free, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert ret == 0 and total == TOTAL and 0 < free < total
    host, ret = acl.rt.malloc_host(4096)
    assert ret == 0 and isinstance(host, int) and host
    for call in (
        acl.rt.free(ptr),
        acl.rt.free_host(host),
        acl.rt.destroy_event(event),
        acl.rt.destroy_stream(stream),
    ):
        assert call == 0
    assert acl.get_recent_err_msg() is None


def test_mem_info_attributes_all_report_device_memory(acl):
    ptr, ret = acl.rt.malloc(8 * MiB, 0)
    assert ret == 0
    for attr in (
        acl.ACL_DDR_MEM,
        acl.ACL_HBM_MEM,
        acl.ACL_DDR_MEM_HUGE,
        acl.ACL_DDR_MEM_NORMAL,
        acl.ACL_HBM_MEM_HUGE,
        acl.ACL_HBM_MEM_NORMAL,
    ):
        free, total, ret = acl.rt.get_mem_info(attr)
        assert (ret, total) == (0, TOTAL) and free <= TOTAL - 8 * MiB
    assert acl.rt.get_mem_info(99) == (0, 0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.free(ptr) == 0


# ---- devices, contexts, streams ------------------------------------------------------------------
def test_devices_and_contexts(acl):
    assert acl.rt.set_device(5) == acl.ACL_ERROR_RT_INVALID_DEVICEID == 107001
    assert "device 5" in acl.get_recent_err_msg()
    assert acl.rt.set_device(0) == 0  # a second reference
    assert acl.rt.reset_device(0) == 0
    context, ret = acl.rt.create_context(0)
    assert ret == 0 and acl.rt.get_context() == (context, 0)
    seen = {}

    def other_thread():
        seen["before"] = acl.rt.create_stream()  # a new thread has no context
        seen["set"] = acl.rt.set_context(context)
        seen["after"] = acl.rt.get_context()

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen["before"] == (0, acl.ACL_ERROR_RT_CONTEXT_NULL)
    assert seen["set"] == 0 and seen["after"] == (context, 0)
    assert acl.rt.destroy_context(context) == 0
    assert acl.rt.destroy_context(context) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.set_context(context) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.get_context() == (0, acl.ACL_ERROR_RT_CONTEXT_NULL)  # it was current
    assert acl.rt.set_device(0) == 0
    assert acl.rt.reset_device_force(0) == 0  # both references at once
    assert acl.rt.reset_device(0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.get_device() == (0, acl.ACL_ERROR_RT_CONTEXT_NULL)
    assert acl.rt.set_device(0) == 0


def test_stream_priority_is_clamped_and_force_destroy_drops_work(acl):
    for priority in (0, 7, 100, -1):
        stream, ret = acl.rt.create_stream_with_config(priority, 0)
        assert ret == 0
        assert acl.rt.destroy_stream(stream) == 0
    stream, _ = acl.rt.create_stream()
    gate = threading.Event()
    assert acl.rt.launch_host_func(stream, lambda _: gate.wait(30), None) == 0
    ptr, _ = acl.rt.malloc(MiB, 0)
    assert acl.rt.memset_async(ptr, MiB, 1, MiB, stream) == 0
    assert acl.rt.stream_query(stream) == (acl.ACL_STREAM_STATUS_NOT_READY, 0)
    threading.Timer(0.2, gate.set).start()
    assert acl.rt.destroy_stream_force(stream) == 0
    assert acl.rt.destroy_stream(stream) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.free(ptr) == 0


def test_bad_handles_return_107017(acl):
    bad = 0x12345
    assert acl.rt.destroy_stream(bad) == 107017
    assert acl.rt.synchronize_stream(bad) == 107017
    assert acl.rt.stream_query(bad) == (acl.ACL_STREAM_STATUS_RESERVED, 107017)
    assert acl.rt.record_event(bad, 0) == 107017
    assert acl.rt.stream_wait_event(0, bad) == 107017
    assert acl.rt.query_event_status(bad) == (0, 107017)
    assert acl.rt.destroy_event(bad) == 107017
    assert acl.rt.event_elapsed_time(bad, bad) == (0.0, 107017)
    assert acl.rt.binary_get_function(bad, "add_f32") == (0, 107017)
    assert acl.rt.binary_unload(bad) == 107017
    assert acl.rt.launch_kernel(bad, 1, 8, 8, 0) == 107017
    assert "not valid" in acl.get_recent_err_msg()


def test_bad_pointers_and_counts(acl):
    ptr, _ = acl.rt.malloc(1024, 0)
    host = bytes(4096)
    hp = acl.util.bytes_to_ptr(host)
    h2d, d2h = acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_MEMCPY_DEVICE_TO_HOST
    assert acl.rt.memcpy(ptr, 1024, hp, 2048, h2d) == 107000  # count > destMax
    assert acl.rt.memcpy(ptr, 4096, hp, 2048, h2d) == 107000  # past the allocation
    assert acl.rt.memcpy(ptr + 4096, 16, hp, 16, h2d) == 107000  # not an allocation
    assert acl.rt.memcpy(hp, 16, ptr, 16, h2d) == 107000  # kind contradicts a device pointer
    assert acl.rt.memcpy(ptr, 16, 0, 16, h2d) == acl.ACL_ERROR_INVALID_PARAM == 100000
    assert acl.rt.memcpy(ptr, 16, hp, 16, 42) == 107000  # unknown kind
    assert acl.rt.memset(ptr, 1024, 0, 2048) == 107000
    assert acl.rt.memset_async(ptr + 512, 1024, 0, 1024, 0) == 107000
    assert acl.rt.memcpy_async(ptr, 16, hp, 16, h2d, 0x777) == 107017
    assert acl.rt.malloc(0, 0) == (0, 100000)
    assert acl.rt.malloc_host(0) == (0, 100000)
    assert acl.rt.free(ptr + 64) == 107000
    assert acl.rt.free(ptr) == 0
    assert acl.rt.free(ptr) == 107000  # double free
    assert acl.rt.free_host(hp) == 107000  # not pinned memory
    assert acl.rt.memcpy(hp, 16, ptr, 16, d2h) == 107000  # freed
    assert acl.rt.malloc(1 << 40, 0) == (0, acl.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert "out of device memory" in acl.get_recent_err_msg()


def test_copies_round_trip(acl):
    stream, _ = acl.rt.create_stream()
    data = np.random.default_rng(0).integers(0, 256, 3 * MiB, dtype=np.uint8)
    source = data.tobytes()
    a, _ = acl.rt.malloc(len(source), 0)
    b, _ = acl.rt.malloc(len(source), 0)
    pinned, _ = acl.rt.malloc_host(len(source))
    out = bytes(len(source))
    n = len(source)
    assert acl.rt.memcpy(a, n, acl.util.bytes_to_ptr(source), n, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    assert acl.rt.memcpy_async(b, n, a, n, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, stream) == 0
    assert acl.rt.memcpy_async(pinned, n, b, n, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(host_view(pinned, n), data)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), n, b, n, acl.ACL_MEMCPY_DEFAULT) == 0
    assert out == source
    assert acl.rt.memset(b, n, 0xAB, 1000) == 0
    assert acl.rt.memset_async(b + 1000, n - 1000, 0xCD, 24, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), n, b, 2048, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    assert (
        out[:1000] == b"\xab" * 1000
        and out[1000:1024] == b"\xcd" * 24
        and out[1024:2048] == source[1024:2048]
    )
    assert acl.rt.memset(pinned, n, 7, 16) == 0  # host memory: filled at once
    assert bytes(host_view(pinned, 16)) == b"\x07" * 16
    for ptr in (a, b):
        assert acl.rt.free(ptr) == 0
    assert acl.rt.free_host(pinned) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_host_to_host_memcpy_is_made_whatever_the_kind(acl):
    pinned, _ = acl.rt.malloc_host(64)
    assert acl.rt.memset(pinned, 64, 7, 64) == 0
    for kind in (
        acl.ACL_MEMCPY_HOST_TO_HOST,
        acl.ACL_MEMCPY_DEVICE_TO_HOST,
        acl.ACL_MEMCPY_HOST_TO_DEVICE,
    ):
        out = bytes(64)
        assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), 64, pinned, 64, kind) == 0
        assert out == b"\x07" * 64
    out = bytes(64)
    assert (
        acl.rt.memcpy_async(
            acl.util.bytes_to_ptr(out), 64, pinned, 64, acl.ACL_MEMCPY_HOST_TO_HOST, 0
        )
        == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    )
    assert acl.rt.free_host(pinned) == 0


def test_events_order_two_streams(acl):
    first, _ = acl.rt.create_stream()
    second, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    ptr, _ = acl.rt.malloc(64, 0)
    pinned, _ = acl.rt.malloc_host(64)
    gate = threading.Event()
    assert acl.rt.launch_host_func(first, lambda _: gate.wait(30), None) == 0
    assert acl.rt.memset_async(ptr, 64, 0x5A, 64, first) == 0
    assert acl.rt.record_event(event, first) == 0
    assert acl.rt.stream_wait_event(second, event) == 0
    assert acl.rt.memcpy_async(pinned, 64, ptr, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST, second) == 0
    assert (
        acl.rt.synchronize_stream_with_timeout(second, 100)
        == acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        == 507046
    )
    assert (
        acl.rt.synchronize_event_with_timeout(event, 50)
        == acl.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
        == 507047
    )
    assert acl.rt.synchronize_device_with_timeout(50) == 507046
    assert acl.rt.query_event(event) == (acl.ACL_EVENT_STATUS_NOT_READY, 0)
    assert acl.rt.event_elapsed_time(event, event)[1] == acl.ACL_ERROR_RT_EVENT_NOT_COMPLETE
    gate.set()
    assert acl.rt.synchronize_stream(second) == 0
    assert bytes(host_view(pinned, 64)) == b"\x5a" * 64
    assert acl.rt.reset_event(event, first) == 0
    assert acl.rt.synchronize_device() == 0
    assert acl.rt.set_stream_failure_mode(first, acl.ACL_STOP_ON_FAILURE) == 0
    for call in (
        acl.rt.destroy_event(event),
        acl.rt.free(ptr),
        acl.rt.free_host(pinned),
        acl.rt.destroy_stream(first),
        acl.rt.destroy_stream(second),
    ):
        assert call == 0


# ---- errors --------------------------------------------------------------------------------------
def test_error_messages_and_last_error_are_per_thread(acl):
    assert acl.rt.destroy_stream(0x999) == 107017
    seen = {}

    def other_thread():
        seen["message"] = acl.get_recent_err_msg()
        seen["last"] = acl.rt.get_last_error()
        seen["own"] = acl.rt.malloc(0, 0)
        seen["own message"] = acl.get_recent_err_msg()

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen["message"] is None and seen["last"] == 0
    assert seen["own"] == (0, 100000) and "acl.rt.malloc" in seen["own message"]
    assert acl.rt.peek_at_last_error() == 107017
    assert acl.rt.peek_at_last_error(acl.ACL_RT_THREAD_LEVEL) == 107017
    assert acl.rt.get_last_error() == 107017
    assert acl.rt.get_last_error() == 0
    message = acl.get_recent_err_msg()
    assert message.startswith("acl.rt.destroy_stream: ACL_ERROR_RT_INVALID_HANDLE (107017)")
    assert acl.get_recent_err_msg() is None  # returned once, then cleared
    assert acl.rt.set_device(0) == 0  # success keeps the last error
    assert acl.rt.get_last_error() == 0


def test_wrong_argument_types_raise_type_error(acl):
    for call in (
        lambda: acl.rt.malloc(1.5, 0),
        lambda: acl.rt.malloc("8", 0),
        lambda: acl.rt.malloc(np.int64(8), 0),  # "k" takes Python ints only
        lambda: acl.rt.set_device("0"),
        lambda: acl.rt.set_device(0.0),
        lambda: acl.rt.create_stream_with_config(1.0, 0),
        lambda: acl.rt.memcpy(None, 4, 1, 4, 1),
        lambda: acl.rt.synchronize_stream(None),
        lambda: acl.rt.binary_get_function(1, 5),
        lambda: acl.rt.record_event(1),
        lambda: acl.rt.launch_callback("not callable", [], 1, 0),
        lambda: acl.rt.launch_host_func(0, None, None),
    ):
        with pytest.raises(TypeError):
            call()
    assert acl.rt.set_device(np.int32(0)) == 0  # "i" takes anything with __index__
    assert (
        acl.rt.reset_device(True) == acl.ACL_ERROR_RT_INVALID_DEVICEID
    )  # bool is an int: device 1


def test_an_array_given_for_a_pointer_is_named_with_its_parameter(acl):
    """A numpy array (or bytes) where an address belongs: a TypeError naming the call, the
    parameter, what it takes and what it got, and where an address comes from -- not
    numpy's own message -- and nothing reaches the session."""
    array = np.zeros(16, np.uint8)
    device, ret = acl.rt.malloc(16, 0)
    assert ret == 0
    for call, prefix in (
        (
            lambda: acl.rt.memcpy(array, 16, device, 16, acl.ACL_MEMCPY_DEVICE_TO_HOST),
            "acl.rt.memcpy args parse failed: argument 1 (dst) must be a pointer (int), not "
            "numpy.ndarray: acl.util.numpy_to_ptr(array) is the address of an array's host "
            "memory; device addresses are the ints acl.rt.malloc returns",
        ),
        (
            lambda: acl.rt.memcpy(device, 16, array, 16, acl.ACL_MEMCPY_HOST_TO_DEVICE),
            "acl.rt.memcpy args parse failed: argument 3 (src) must be a pointer (int), not "
            "numpy.ndarray: acl.util.numpy_to_ptr(array)",
        ),
        (
            lambda: acl.rt.free(array),
            "acl.rt.free args parse failed: argument 1 (dev_ptr) must be a pointer (int), not "
            "numpy.ndarray",
        ),
        (
            lambda: acl.rt.memset_async(b"data", 4, 0, 4, 0),
            "acl.rt.memset_async args parse failed: argument 1 (dev_ptr) must be a pointer "
            "(int), not bytes: acl.util.bytes_to_ptr(data)",
        ),
        (
            lambda: acl.rt.free("0x1000"),
            "acl.rt.free args parse failed: argument 1 (dev_ptr) must be a pointer (int), not str",
        ),
        (
            lambda: acl.rt.memcpy(device, array, device, 16, acl.ACL_MEMCPY_DEVICE_TO_DEVICE),
            "acl.rt.memcpy args parse failed: argument 2 (dest_max) must be int, not numpy.ndarray",
        ),
        (
            lambda: acl.rt.set_device(array),
            "acl.rt.set_device args parse failed: argument 1 (device_id) must be int, not "
            "numpy.ndarray",
        ),
    ):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value).startswith(prefix), info.value
    assert acl.get_recent_err_msg() is None  # a wrong type is not an ACL error
    assert acl.rt.free(device) == 0


def test_unsupported_calls_return_207000_in_pyacl_shape(acl):
    from acl import rt

    assert len(rt.UNSUPPORTED) > 50
    for name in rt.UNSUPPORTED:
        result = getattr(rt, name)(1, 2, 3)
        code = (
            result if isinstance(result, int) else result[-1] if isinstance(result, tuple) else None
        )
        if name in ("create_binary", "allocator_create_desc", "create_group_info") or name.endswith(
            "_from_exception_info"
        ):
            assert result in (0, 0xFFFFFFFF), name  # no aclError: just the value
        else:
            assert code == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, name
        message = acl.get_recent_err_msg()
        assert "not supported by the simulated NPU" in message and f"acl.rt.{name}" in message
    assert acl.rt.device_task_abort(0, 0) == 207000
    assert acl.rt.query_event_wait_status(1) == (acl.ACL_EVENT_WAIT_STATUS_RESERVED, 207000)
    assert acl.rt.get_primary_ctx_state(0) == (0, 0, 207000)
    assert acl.rt.create_binary(0, 0) == 0
    assert acl.rt.get_last_error() == 207000


def test_modules_simnpu_does_not_provide_say_why(acl):
    for name in ("op", "blas"):
        with pytest.raises(AttributeError, match="not provided by simnpu"):
            getattr(acl, name)
    # acl.mdl is graph capture; only offline (.om) models are refused, saying why
    assert acl.mdl.load_from_file("model.om") == (0, 207000)
    assert "offline models (.om files) are not simulated" in acl.get_recent_err_msg()
    with pytest.raises(AttributeError, match="DVPP"):
        _ = acl.media.dvpp_vpc_resize_async
    ptr, ret = acl.media.dvpp_malloc(4096)
    assert ret == 0 and ptr
    assert acl.rt.memset(ptr, 4096, 1, 4096) == 0
    assert acl.media.dvpp_free(ptr) == 0
    assert acl.media.dvpp_free(ptr) == 107000


def test_argument_struct_layout_matches_c(acl):
    """launch arguments are the C struct of the kernel's parameter types: little-endian,
    naturally aligned, ptr 8 bytes (here: ptr, f32, u32 -> 16 bytes, no padding)."""
    fill, _ = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "fill_f32")
    ptr, _ = acl.rt.malloc(64, 0)
    args = struct.pack("<QfI", ptr, 2.5, 16)
    assert len(args) == 16
    assert (
        acl.rt.launch_kernel_with_host_args(
            fill, 1, 0, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.synchronize_stream(0) == 0
    out = bytes(64)
    assert (
        acl.rt.memcpy(acl.util.bytes_to_ptr(out), 64, ptr, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    )
    assert np.array_equal(np.frombuffer(out, np.float32), np.full(16, 2.5, np.float32))
    assert acl.rt.free(ptr) == 0
