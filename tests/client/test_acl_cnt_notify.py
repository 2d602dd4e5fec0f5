"""Count notifies through acl (aclrtCntNotifyCreate ... aclrtCntNotifyGetId), against a real
daemon: record modes, wait conditions, clearing, timeouts and bad input."""

from __future__ import annotations

import pytest
from conftest import run_client

from simnpu.proto import codes


def _blocked(acl, stream) -> bool:
    return (
        acl.rt.synchronize_stream_with_timeout(stream, 100)
        == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    )


def _wait(mode, value, timeout=0, clear=0) -> dict:
    return {"mode": mode, "value": value, "timeout": timeout, "is_clear": clear}


def test_records_release_a_wait_by_count(acl):
    notify, ret = acl.rt.cnt_notify_create(0)
    assert ret == 0 and notify
    waiter, _ = acl.rt.create_stream()
    recorder, _ = acl.rt.create_stream()
    add = {"mode": acl.ACL_RT_CNT_NOTIFY_RECORD_ADD_MODE, "value": 1}
    geq3 = _wait(acl.ACL_RT_CNT_NOTIFY_WAIT_BIGGER_OR_EQUAL_MODE, 3, clear=1)
    assert acl.rt.cnt_notify_wait_with_timeout(notify, waiter, geq3) == 0
    for _ in range(2):
        assert acl.rt.cnt_notify_record(notify, recorder, add) == 0
    assert acl.rt.synchronize_stream(recorder) == 0
    assert _blocked(acl, waiter)  # 2 < 3
    assert acl.rt.cnt_notify_record(notify, recorder, add) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    # the wait cleared the count: EQUAL 0 holds at once, BIGGER 0 waits
    assert acl.rt.cnt_notify_wait_with_timeout(notify, waiter, _wait(1, 0)) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    assert acl.rt.cnt_notify_wait_with_timeout(notify, waiter, _wait(2, 0)) == 0
    assert _blocked(acl, waiter)
    assert acl.rt.cnt_notify_record(notify, recorder, {"mode": 0, "value": 0xFFFFFFFF}) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    # not cleared this time; ADD wraps at 32 bits
    assert acl.rt.cnt_notify_record(notify, recorder, add) == 0
    assert acl.rt.cnt_notify_wait_with_timeout(notify, recorder, _wait(1, 0)) == 0
    assert acl.rt.synchronize_stream(recorder) == 0
    for stream in (waiter, recorder):
        assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.cnt_notify_destroy(notify) == 0


@pytest.mark.parametrize(
    ("record", "wait", "holds"),
    [
        ({"mode": 0, "value": 5}, _wait(0, 6), True),  # LESS
        ({"mode": 0, "value": 6}, _wait(0, 6), False),
        ({"mode": 0, "value": 6}, _wait(2, 5), True),  # BIGGER
        ({"mode": 0, "value": 5}, _wait(2, 5), False),
        ({"mode": 2, "value": 0b1010}, _wait(4, 0b1010), True),  # OR, EQUAL_WITH_BITMASK
        ({"mode": 4, "value": 0b0010}, _wait(4, 0b1010), False),  # AND clears bits
        ({"mode": 4, "value": 0}, _wait(1, 0), True),
    ],
)
def test_modes(acl, record, wait, holds):
    notify, _ = acl.rt.cnt_notify_create(0)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.cnt_notify_record(notify, stream, {"mode": 0, "value": 0xF}) == 0
    assert acl.rt.cnt_notify_record(notify, stream, record) == 0
    assert acl.rt.cnt_notify_wait_with_timeout(notify, stream, wait) == 0
    if holds:
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.destroy_stream(stream) == 0
    else:
        assert _blocked(acl, stream)
        assert acl.rt.destroy_stream_force(stream) == 0
    assert acl.rt.cnt_notify_destroy(notify) == 0


def test_reset_and_timeout(acl):
    notify, _ = acl.rt.cnt_notify_create(0)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.cnt_notify_record(notify, stream, {"mode": 1, "value": 4}) == 0
    assert acl.rt.cnt_notify_reset(notify, stream) == 0
    assert acl.rt.cnt_notify_wait_with_timeout(notify, stream, _wait(3, 1, timeout=1)) == 0
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_WAIT_TIMEOUT
    assert "within 1 s" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0  # reported once; the stream goes on
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.cnt_notify_destroy(notify) == 0


def test_ids_and_bad_input(acl):
    first, _ = acl.rt.cnt_notify_create(0)
    second, _ = acl.rt.cnt_notify_create(0)
    ids = [acl.rt.cnt_notify_get_id(n) for n in (first, second)]
    assert all(ret == 0 for _, ret in ids) and ids[0][0] != ids[1][0]
    assert acl.rt.cnt_notify_create(1) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    stream, _ = acl.rt.create_stream()
    record, wait = {"mode": 0, "value": 1}, _wait(1, 1)
    assert acl.rt.cnt_notify_record(first, stream, None) == codes.ACL_ERROR_INVALID_PARAM
    assert acl.rt.cnt_notify_wait_with_timeout(first, stream, None) == codes.ACL_ERROR_INVALID_PARAM
    for bad in ({"mode": 3, "value": 1}, {"mode": 5, "value": 1}, {"mode": 0, "value": 1 << 32}):
        assert acl.rt.cnt_notify_record(first, stream, bad) == codes.ACL_ERROR_RT_PARAM_INVALID
    for bad in (_wait(5, 1), _wait(1, -1), _wait(1, 1, timeout=-1)):
        assert (
            acl.rt.cnt_notify_wait_with_timeout(first, stream, bad)
            == codes.ACL_ERROR_RT_PARAM_INVALID
        )
    with pytest.raises(TypeError):
        acl.rt.cnt_notify_record(first, stream, [0, 1])
    with pytest.raises(TypeError):
        acl.rt.cnt_notify_wait_with_timeout(first, stream, {"mode": 0})
    assert acl.rt.cnt_notify_destroy(first) == 0
    assert acl.rt.cnt_notify_destroy(first) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.cnt_notify_get_id(first) == (0, codes.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.rt.cnt_notify_record(first, stream, record) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.cnt_notify_reset(first, 0) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert (
        acl.rt.cnt_notify_wait_with_timeout(first, stream, wait)
        == codes.ACL_ERROR_RT_INVALID_HANDLE
    )
    assert acl.rt.cnt_notify_record(second, 12345, record) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.cnt_notify_destroy(second) == 0


def test_a_client_ending_with_a_waiting_stream_and_a_strangers_handle(daemon, acl):
    notify, _ = acl.rt.cnt_notify_create(0)
    code = f"""
        import acl
        from simnpu.client import facade
        from simnpu.proto import commands
        assert acl.rt.set_device(0) == 0
        rt = facade.session()
        stream = rt.contexts.stream(0)
        record = commands.CntNotifyRecord.pack({notify}, stream, 0, 1)
        rt.connection.send_command(record, "x", stream)
        print(acl.rt.synchronize_stream(0))
        mine, _ = acl.rt.cnt_notify_create(0)
        waiting, _ = acl.rt.create_stream()
        info = {{"mode": 1, "value": 9, "timeout": 0, "is_clear": 0}}
        assert acl.rt.cnt_notify_wait_with_timeout(mine, waiting, info) == 0
        import os
        os._exit(0)
    """
    result = run_client(daemon.address, code)
    assert result.stdout.split() == [str(codes.ACL_ERROR_RT_INVALID_HANDLE)], result.stderr
    stream, _ = acl.rt.create_stream()
    assert acl.rt.cnt_notify_wait_with_timeout(notify, stream, _wait(1, 0)) == 0  # untouched
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.cnt_notify_destroy(notify) == 0
