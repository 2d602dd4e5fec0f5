"""acl.rt errors and exceptions against a real daemon: exception-info callbacks and their
getters, the thread's last task id, the device's verbose error info."""

from __future__ import annotations

import struct
import threading

import pytest

FAILS = """
from simnpu import kernel

@kernel("ptr")
def fails(ctx, x):
    raise ValueError("this kernel always fails")
"""
U32 = 0xFFFFFFFF


@pytest.fixture
def failing(acl):
    """(function, device buffer, stream) of a kernel that always fails."""
    binary, ret = acl.rt.binary_load_from_data(FAILS)
    assert ret == 0
    function, _ = acl.rt.binary_get_function(binary, "fails")
    buffer, _ = acl.rt.malloc(64, 0)
    stream, _ = acl.rt.create_stream()
    yield function, buffer, stream
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(buffer) == 0
    assert acl.rt.binary_unload(binary) == 0


def getters(acl, info):
    return {
        "task": acl.rt.get_task_id_from_exception_info(info),
        "stream": acl.rt.get_stream_id_from_exception_info(info),
        "thread": acl.rt.get_thread_id_from_exception_info(info),
        "device": acl.rt.get_device_id_from_exception_info(info),
        "code": acl.rt.get_error_code_from_exception_info(info),
        "args": acl.rt.get_args_from_exception_info(info),
        "func": acl.rt.get_func_handle_from_exception_info(info),
        "caller": threading.current_thread() is threading.main_thread(),
    }


def test_callback_reports_the_failed_launch(acl, failing):
    function, buffer, stream = failing
    seen = []

    def callback(info):
        seen.append((info, getters(acl, info)))

    assert acl.rt.exception_info_callback_register(callback) == 0
    assert acl.rt.exception_info_callback_register(callback) == 0  # twice: still one
    try:
        args, _ = acl.rt.malloc(8, 0)
        packed = struct.pack("<Q", buffer)
        assert acl.rt.memcpy(args, 8, acl.util.bytes_to_ptr(packed), 8, 1) == 0
        assert acl.rt.launch_kernel(function, 1, args, 8, stream) == 0
        task, ret = acl.rt.get_thread_last_task_id()
        assert ret == 0 and task
        assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
        assert len(seen) == 1  # before synchronize returned, once
        info, got = seen[0]
        assert isinstance(info, int) and info
        assert got == {
            "task": task,
            "stream": acl.rt.stream_get_id(stream)[0],
            "thread": threading.get_native_id(),
            "device": 0,
            "code": acl.ACL_ERROR_RT_AICORE_EXCEPTION,
            "args": ((args, 8), 0),
            "func": (function, 0),
            "caller": False,  # on a thread of its own
        }
        assert acl.rt.synchronize_stream(stream) == 0  # reported once
        assert len(seen) == 1
        # the info is valid while the callbacks run
        assert acl.rt.get_task_id_from_exception_info(info) == U32
        assert acl.rt.free(args) == 0
    finally:
        assert acl.rt.exception_info_callback_unregister(callback) == 0
    assert acl.rt.exception_info_callback_unregister(callback) == 0  # not registered: fine


def test_host_args_launch_and_every_callback(acl, failing):
    function, buffer, stream = failing
    first, second, legacy = [], [], []
    assert acl.rt.exception_info_callback_register(lambda i: first.append(getters(acl, i))) == 0
    assert acl.rt.exception_info_callback_register(lambda i: second.append(i)) == 0
    assert acl.rt.set_exception_info_callback(lambda i: legacy.append(i)) == 0
    try:
        packed = struct.pack("<Q", buffer)
        assert (
            acl.rt.launch_kernel_with_host_args(
                function, 1, stream, None, acl.util.bytes_to_ptr(packed), 8
            )
            == 0
        )
        assert acl.rt.synchronize_device() == acl.ACL_ERROR_RT_AICORE_EXCEPTION
        assert len(first) == len(second) == len(legacy) == 1
        assert second[0] == legacy[0]
        assert first[0]["args"] == ((0, 0), 207000)  # host arguments: no device copy
        assert first[0]["func"] == (function, 0)
    finally:
        from simnpu.client.exceptions import EXCEPTIONS

        EXCEPTIONS._callbacks.clear()  # the lambdas cannot be unregistered by name
        assert acl.rt.set_exception_info_callback(None) == 0


def test_a_failed_copy_has_no_function(acl):
    seen = []
    assert acl.rt.exception_info_callback_register(seen.append) == 0
    try:
        ptr, _ = acl.rt.malloc(4096, 0)
        assert acl.rt.free(ptr) == 0
        assert acl.rt.free(ptr) == 107000  # refused at once: no task, no callback
        assert seen == []
    finally:
        assert acl.rt.exception_info_callback_unregister(seen.append) == 0


def test_callback_and_getter_bad_input(acl):
    assert acl.rt.exception_info_callback_register(None) == 107000
    assert acl.rt.exception_info_callback_unregister(None) == 107000
    with pytest.raises(TypeError):
        acl.rt.exception_info_callback_register(5)
    with pytest.raises(TypeError):
        acl.rt.set_exception_info_callback(5)
    for info in (0, 12345):
        assert acl.rt.get_task_id_from_exception_info(info) == U32
        assert acl.rt.get_stream_id_from_exception_info(info) == U32
        assert acl.rt.get_thread_id_from_exception_info(info) == U32
        assert acl.rt.get_device_id_from_exception_info(info) == U32
        assert acl.rt.get_error_code_from_exception_info(info) == U32
        assert acl.rt.get_args_from_exception_info(info) == ((0, 0), -1)
        assert acl.rt.get_func_handle_from_exception_info(info) == (0, -1)
    with pytest.raises(TypeError):
        acl.rt.get_task_id_from_exception_info(None)


def test_a_raising_callback_does_not_break_the_synchronize(acl, failing, capfd):
    function, buffer, stream = failing

    def broken(info):
        raise RuntimeError("broken exception callback")

    assert acl.rt.exception_info_callback_register(broken) == 0
    try:
        packed = struct.pack("<Q", buffer)
        ptr = acl.util.bytes_to_ptr(packed)
        assert acl.rt.launch_kernel_with_host_args(function, 1, stream, None, ptr, 8) == 0
        assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    finally:
        assert acl.rt.exception_info_callback_unregister(broken) == 0
    assert "broken exception callback" in capfd.readouterr().err
    assert acl.rt.synchronize_stream(stream) == 0


def test_thread_last_task_id(acl):
    event, _ = acl.rt.create_event()
    assert acl.rt.record_event(event, 0) == 0
    mine, ret = acl.rt.get_thread_last_task_id()
    assert ret == 0 and mine
    results = []

    def other():
        results.append(acl.rt.get_thread_last_task_id())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert results == [(0, 0)]  # that thread submitted nothing
    assert acl.rt.record_event(event, 0) == 0
    later, _ = acl.rt.get_thread_last_task_id()
    assert later > mine
    assert acl.rt.synchronize_stream(0) == 0
    assert acl.rt.destroy_event(event) == 0


def test_error_verbose(acl, failing):
    info, ret = acl.rt.get_error_verbose(0)
    assert ret == 0
    assert info["error_type"] in (acl.ACL_RT_NO_ERROR, acl.ACL_RT_ERROR_AICORE)
    assert set(info) == {"try_repair", "has_detail", "reserved", "error_type", "detail"}
    function, buffer, stream = failing
    packed = struct.pack("<Q", buffer)
    ptr = acl.util.bytes_to_ptr(packed)
    assert acl.rt.launch_kernel_with_host_args(function, 1, stream, None, ptr, 8) == 0
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    info, ret = acl.rt.get_error_verbose(0)
    assert ret == 0
    assert info["error_type"] == acl.ACL_RT_ERROR_AICORE and info["has_detail"] == 1
    assert info["detail"]["aicore_err_type"] == acl.ACL_RT_AICORE_ERROR_SW
    assert acl.rt.get_error_verbose(1) == ({}, 107001)
    assert acl.rt.get_error_verbose(-1) == ({}, 107001)
