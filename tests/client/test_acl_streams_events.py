"""acl.rt streams and events beyond the basics, against a real daemon: stream config
handles and create_stream_v2, stream id / flags / priority, stream state callbacks, events
recorded and waited with a flag or timeout, event timestamps."""

from __future__ import annotations

import struct
import threading
import time

import pytest
from conftest import GATE, run_client


def hold(acl, stream):
    """Hold `stream` with the gate kernel; returns the function that lets it go."""
    binary, ret = acl.rt.binary_load_from_data(GATE)
    assert ret == 0
    gate, _ = acl.rt.binary_get_function(binary, "gate")
    flag, _ = acl.rt.malloc(4, 0)
    assert acl.rt.memset(flag, 4, 0, 4) == 0
    args = struct.pack("<Qd", flag, 60.0)
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )

    def release():
        one = struct.pack("<i", 1)
        assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.free(flag) == 0
        assert acl.rt.binary_unload(binary) == 0

    return release


# ---- stream config handles and create_stream_v2 ----------------------------------------------
def test_create_stream_v2_takes_the_config(acl):
    config = acl.rt.create_stream_config_handle()
    assert isinstance(config, int) and config
    assert acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_PRIORITY, 3) == 0
    assert acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_FLAG, acl.ACL_STREAM_HUGE) == 0
    assert acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_WORK_SIZE, 4096) == 0
    stream, ret = acl.rt.create_stream_v2(config)
    assert ret == 0 and stream
    assert acl.rt.stream_get_priority(stream) == (3, 0)
    assert acl.rt.stream_get_flags(stream) == (acl.ACL_STREAM_HUGE, 0)
    stream_id, ret = acl.rt.stream_get_id(stream)
    assert ret == 0 and 0 < stream_id < 2**31
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_stream_config_handle(config) == 0
    assert acl.get_recent_err_msg() is None


def test_create_stream_v2_clamps_priority_and_defaults(acl):
    config = acl.rt.create_stream_config_handle()
    stream, ret = acl.rt.create_stream_v2(config)  # nothing set: priority 0, no flags
    assert ret == 0
    assert acl.rt.stream_get_priority(stream) == (0, 0)
    assert acl.rt.stream_get_flags(stream) == (0, 0)
    assert acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_PRIORITY, 100) == 0
    low, ret = acl.rt.create_stream_v2(config)
    assert ret == 0 and acl.rt.stream_get_priority(low) == (7, 0)
    for handle in (stream, low):
        assert acl.rt.destroy_stream(handle) == 0
    assert acl.rt.destroy_stream_config_handle(config) == 0


def test_stream_config_bad_input(acl):
    config = acl.rt.create_stream_config_handle()
    assert acl.rt.set_stream_config_opt(0, acl.ACL_RT_STREAM_FLAG, 0) == 100000
    assert acl.rt.set_stream_config_opt(config + 999, acl.ACL_RT_STREAM_FLAG, 0) == 100000
    assert acl.rt.set_stream_config_opt(config, 4, 0) == 100000
    assert acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_PRIORITY, -1) == 100000
    assert acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_PRIORITY, "1") == 100000
    assert acl.rt.create_stream_v2(0) == (0, 100000)
    assert acl.rt.destroy_stream_config_handle(0) == 100000
    assert acl.rt.destroy_stream_config_handle(config) == 0
    assert acl.rt.destroy_stream_config_handle(config) == 100000  # twice
    assert acl.rt.create_stream_v2(config) == (0, 100000)  # destroyed
    with pytest.raises(TypeError):
        acl.rt.destroy_stream_config_handle(None)


# ---- stream introspection -------------------------------------------------------------------
def test_stream_getters(acl):
    stream, _ = acl.rt.create_stream_with_config(
        5, acl.ACL_STREAM_FAST_LAUNCH | acl.ACL_STREAM_FAST_SYNC
    )
    assert acl.rt.stream_get_priority(stream) == (5, 0)
    assert acl.rt.stream_get_flags(stream) == (3, 0)
    default, _ = acl.rt.ctx_get_current_default_stream()
    assert acl.rt.stream_get_id(0) == acl.rt.stream_get_id(default)
    assert acl.rt.stream_get_priority(0) == (0, 0)
    assert acl.rt.stream_get_flags(0) == (0, 0)
    assert acl.rt.stream_get_id(0)[0] != acl.rt.stream_get_id(stream)[0]
    assert acl.rt.destroy_stream(stream) == 0
    for call in (acl.rt.stream_get_id, acl.rt.stream_get_priority, acl.rt.stream_get_flags):
        assert call(stream) == (0, 107017)  # destroyed
        assert call(12345) == (0, 107017)


def test_stream_getters_need_a_context(acl):
    results = []

    def other_thread():
        results.append(acl.rt.stream_get_id(0))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert results == [(0, 107002)]


# ---- stream state callbacks ------------------------------------------------------------------
def test_stream_state_callbacks(acl):
    seen = []
    assert acl.rt.reg_stream_state_callback("test", lambda *a: seen.append(a), "tag") == 0
    stream, _ = acl.rt.create_stream()
    assert seen == [(stream, acl.ACL_RT_STREAM_STATE_CREATE_POST, "tag")]
    assert acl.rt.destroy_stream(stream) == 0
    assert seen[1] == (stream, acl.ACL_RT_STREAM_STATE_DESTROY_PRE, "tag")
    assert acl.rt.reg_stream_state_callback("test", None, None) == 0  # removed
    stream, _ = acl.rt.create_stream()
    assert acl.rt.destroy_stream(stream) == 0
    assert len(seen) == 2
    assert acl.rt.reg_stream_state_callback(None, None, None) == 100000
    with pytest.raises(TypeError):
        acl.rt.reg_stream_state_callback("test", 5, None)


def test_a_raising_stream_state_callback_does_not_fail_the_call(acl, capfd):
    def broken(stream, state, args):
        raise RuntimeError("broken callback")

    assert acl.rt.reg_stream_state_callback("broken", broken, None) == 0
    try:
        stream, ret = acl.rt.create_stream()
        assert ret == 0
        assert acl.rt.destroy_stream(stream) == 0
    finally:
        assert acl.rt.reg_stream_state_callback("broken", None, None) == 0
    assert "broken callback" in capfd.readouterr().err


# ---- events with a flag or a timeout ---------------------------------------------------------
def test_record_and_wait_with_flags(acl):
    first, _ = acl.rt.create_stream()
    second, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    assert acl.rt.record_event_with_flag(event, first, acl.ACL_EVENT_RECORD_DEFAULT) == 0
    assert acl.rt.stream_wait_event_with_flag(second, event, 0, acl.ACL_EVENT_WAIT_DEFAULT) == 0
    assert acl.rt.stream_wait_event_with_timeout(second, event, 0) == 0
    assert acl.rt.synchronize_stream(second) == 0
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    # no stream is being captured into a model: external records and waits are 107029
    assert acl.rt.record_event_with_flag(event, first, acl.ACL_EVENT_RECORD_EXTERNAL) == 107029
    assert acl.rt.stream_wait_event_with_flag(second, event, 0, acl.ACL_EVENT_WAIT_EXTERNAL) == (
        107029
    )
    for handle in (first, second):
        assert acl.rt.destroy_stream(handle) == 0
    assert acl.rt.destroy_event(event) == 0


def test_event_flags_and_timeouts_bad_input(acl):
    event, _ = acl.rt.create_event()
    assert acl.rt.record_event_with_flag(0, 0, 0) == 100000
    assert acl.rt.record_event_with_flag(event, 0, 2) == 100000
    assert acl.rt.record_event_with_flag(12345, 0, 0) == 107017
    assert acl.rt.record_event_with_flag(event, 12345, 0) == 107017
    assert acl.rt.stream_wait_event_with_flag(0, 0, 0, 0) == 100000
    assert acl.rt.stream_wait_event_with_flag(0, event, 0, 2) == 100000
    assert acl.rt.stream_wait_event_with_flag(0, event, 5, acl.ACL_EVENT_WAIT_EXTERNAL) == 100000
    assert acl.rt.stream_wait_event_with_flag(0, event, 0xFFFFFFFF, 0) == 107000  # -1 as int32
    assert acl.rt.stream_wait_event_with_timeout(0, event, -1) == 107000
    assert acl.rt.stream_wait_event_with_timeout(0, 12345, 0) == 107017
    assert acl.rt.record_event_with_flag(event, 0, 2**32) == 100000  # no such flag
    assert acl.rt.synchronize_stream(0) == 0  # nothing was queued by the refused calls
    assert acl.rt.destroy_event(event) == 0


# ---- event timestamps ------------------------------------------------------------------------
def test_event_timestamps(acl):
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    before = time.monotonic_ns() // 1000
    assert acl.rt.record_event(start, 0) == 0
    assert acl.rt.record_event(end, 0) == 0
    assert acl.rt.synchronize_stream(0) == 0
    first, ret = acl.rt.event_get_timestamp(start)
    assert ret == 0
    second, ret = acl.rt.event_get_timestamp(end)
    assert ret == 0
    after = time.monotonic_ns() // 1000
    assert before <= first <= second <= after
    ms, ret = acl.rt.event_elapsed_time(start, end)
    assert ret == 0 and abs(ms * 1000 - (second - first)) <= 1
    for event in (start, end):
        assert acl.rt.destroy_event(event) == 0


def test_event_timestamp_errors(acl):
    event, _ = acl.rt.create_event()
    assert acl.rt.event_get_timestamp(0) == (0, 100000)
    assert acl.rt.event_get_timestamp(12345) == (0, 107017)
    assert acl.rt.event_get_timestamp(event) == (0, 507000)  # never recorded
    stream, _ = acl.rt.create_stream()
    release = hold(acl, stream)
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.event_get_timestamp(event) == (0, 107006)  # recorded, not run yet
    release()
    value, ret = acl.rt.event_get_timestamp(event)
    assert ret == 0 and value
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.event_get_timestamp(event) == (0, 107017)


def test_another_client_is_unharmed(acl, daemon):
    """Bad input here leaves the daemon and a second client of it working."""
    assert acl.rt.event_get_timestamp(12345) == (0, 107017)
    assert acl.rt.create_stream_v2(0) == (0, 100000)
    assert acl.rt.record_event_with_flag(12345, 0, 1) == 107017
    other = run_client(
        daemon.address,
        """
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        event, _ = acl.rt.create_event()
        assert acl.rt.record_event_with_flag(event, 0, 0) == 0
        assert acl.rt.synchronize_stream(0) == 0
        stamp, ret = acl.rt.event_get_timestamp(event)
        assert ret == 0 and stamp > 0
        assert acl.rt.destroy_event(event) == 0 and acl.rt.reset_device(0) == 0
        assert acl.finalize() == 0
        """,
    )
    assert other.returncode == 0, other.stderr
    assert acl.rt.synchronize_stream(0) == 0
