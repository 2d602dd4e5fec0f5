"""acl.rt host callbacks (subscribe_report, launch_callback, process_report), host
functions, and acl.util.start_thread / stop_thread."""

from __future__ import annotations

import errno
import threading
import time

import pytest


def test_callbacks_run_on_the_subscribed_thread_in_stream_order(acl):
    context, _ = acl.rt.get_context()
    stream, _ = acl.rt.create_stream()
    ran, codes_seen = [], []
    stop = threading.Event()

    def loop(args):
        ctx, timeout = args
        codes_seen.append(("set_context", acl.rt.set_context(ctx)))
        while not stop.is_set():
            codes_seen.append(acl.rt.process_report(timeout))

    thread_id, ret = acl.util.start_thread(loop, [context, 50])
    assert ret == 0 and isinstance(thread_id, int)
    assert acl.rt.subscribe_report(thread_id, stream) == 0
    ptr, _ = acl.rt.malloc(64, 0)
    gate = threading.Event()
    assert acl.rt.launch_host_func(stream, lambda _: gate.wait(30), None) == 0
    assert acl.rt.memset_async(ptr, 64, 9, 64, stream) == 0
    assert (
        acl.rt.launch_callback(
            lambda data: ran.append((data, threading.get_ident())),
            ["first"],
            acl.ACL_CALLBACK_BLOCK,
            stream,
        )
        == 0
    )
    assert (
        acl.rt.launch_callback(
            lambda data: ran.append((data, threading.get_ident())),
            ["second"],
            acl.ACL_CALLBACK_NO_BLOCK,
            stream,
        )
        == 0
    )
    time.sleep(0.2)
    assert ran == []  # the stream has not reached them
    gate.set()
    assert acl.rt.synchronize_stream(stream) == 0
    deadline = time.monotonic() + 10
    while len(ran) < 2 and time.monotonic() < deadline:  # NO_BLOCK: the stream did not wait for it
        time.sleep(0.01)
    assert ran == [(["first"], thread_id), (["second"], thread_id)]
    assert acl.rt.unsubscribe_report(thread_id, stream) == 0
    assert acl.rt.unsubscribe_report(thread_id, stream) == acl.ACL_ERROR_STREAM_NOT_SUBSCRIBE
    assert (
        acl.rt.launch_callback(print, [], acl.ACL_CALLBACK_BLOCK, stream)
        == acl.ACL_ERROR_RT_STREAM_NO_CB_REG
    )
    assert acl.get_recent_err_msg().startswith(
        "acl.rt.launch_callback: ACL_ERROR_RT_STREAM_NO_CB_REG (107015)"
    )
    stop.set()
    assert acl.util.stop_thread(thread_id) == 0
    assert codes_seen[0] == ("set_context", 0)
    assert set(codes_seen[1:]) <= {
        0,
        acl.ACL_ERROR_RT_REPORT_TIMEOUT,
        acl.ACL_ERROR_RT_THREAD_SUBSCRIBE,
    }
    assert acl.ACL_ERROR_RT_REPORT_TIMEOUT in codes_seen  # 507012 once nothing was left
    assert acl.rt.free(ptr) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_process_report_codes(acl):
    assert (
        acl.rt.process_report(50) == acl.ACL_ERROR_RT_THREAD_SUBSCRIBE == 107012
    )  # nothing subscribed
    assert acl.rt.process_report(0) == acl.ACL_ERROR_INVALID_PARAM  # ACL rejects 0
    assert acl.rt.process_report(-2) == acl.ACL_ERROR_INVALID_PARAM
    me = threading.get_ident()
    assert acl.rt.subscribe_report(me, 0) == 0  # the default stream, on this thread
    assert acl.rt.subscribe_report(me, 0) == acl.ACL_ERROR_REPEAT_SUBSCRIBE
    begin = time.monotonic()
    assert acl.rt.process_report(100) == acl.ACL_ERROR_RT_REPORT_TIMEOUT == 507012
    assert time.monotonic() - begin >= 0.09
    assert acl.rt.launch_callback(print, [], 7, 0) == acl.ACL_ERROR_INVALID_PARAM
    seen = []
    assert acl.rt.launch_callback(seen.append, "data", acl.ACL_CALLBACK_NO_BLOCK, 0) == 0
    assert acl.rt.process_report(5000) == 0
    assert seen == ["data"]
    assert acl.rt.unsubscribe_report(me, 0) == 0


def test_host_functions_run_in_order_and_hold_the_stream(acl):
    stream, _ = acl.rt.create_stream()
    order = []
    for index in range(5):
        assert acl.rt.launch_host_func(stream, order.append, index) == 0
    event, _ = acl.rt.create_event()
    assert acl.rt.launch_host_func(stream, lambda _: time.sleep(0.2), None) == 0
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
    assert acl.rt.synchronize_stream(stream) == 0
    assert order == list(range(5))
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    assert acl.rt.launch_host_func(0x7777, print, None) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_start_thread_and_stop_thread(acl):
    got = []
    thread_id, ret = acl.util.start_thread(got.append, [1, 2])
    assert ret == 0
    assert acl.util.stop_thread(thread_id) == 0 and got == [[1, 2]]
    thread_id, ret = acl.util.start_thread(
        lambda: got.append("no args"), None
    )  # None: called without one
    assert acl.util.stop_thread(thread_id) == 0 and got[-1] == "no args"

    def boom(args):
        raise KeyError(args)

    thread_id, ret = acl.util.start_thread(boom, "x")
    assert ret == 0
    with pytest.raises(RuntimeError, match="exception=KeyError"):
        acl.util.stop_thread(thread_id)
    assert acl.util.stop_thread(thread_id) == errno.ESRCH  # joined already
    with pytest.raises(TypeError):
        acl.util.start_thread("not callable", [])
