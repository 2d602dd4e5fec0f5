"""Notifies through acl (aclrtCreateNotify, aclrtRecordNotify, aclrtWaitAndResetNotify, and
sharing one between processes by key), against a real daemon."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import textwrap
import time

from conftest import run_client

from simnpu.client.tools.query import query
from simnpu.proto import codes

SIZE = 4096


def _fill(acl, ptr, value, stream):
    """fill_f32 of SIZE/4 floats on `stream` (device work queued behind a wait)."""
    func, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "fill_f32")
    assert ret == 0
    args = struct.pack("<QfI", ptr, value, SIZE // 4)
    assert (
        acl.rt.launch_kernel_with_host_args(
            func, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )


def _read(acl, ptr) -> float:
    host = ctypes.create_string_buffer(SIZE)
    assert acl.rt.memcpy(ctypes.addressof(host), SIZE, ptr, SIZE, 2) == 0
    return struct.unpack_from("<f", host.raw)[0]


def _until_only_this_process_is_served(daemon, timeout: float = 60.0) -> None:
    """Wait until every session of another process has ended in the daemon."""
    deadline = time.monotonic() + timeout
    while True:
        others = [
            p
            for p in query("processes", address=daemon.address)["processes"]
            if p["pid"] != os.getpid()
        ]
        if not others:
            return
        assert time.monotonic() < deadline, f"sessions of other processes stay: {others}"
        time.sleep(0.05)


def test_wait_holds_its_stream_until_the_record(acl):
    notify, ret = acl.rt.create_notify(acl.ACL_NOTIFY_DEFAULT)
    assert ret == 0 and notify
    waiter, _ = acl.rt.create_stream()
    recorder, _ = acl.rt.create_stream()
    ptr, _ = acl.rt.malloc(SIZE, 0)
    assert acl.rt.wait_and_reset_notify(notify, waiter, 0) == 0  # before any record: waits
    _fill(acl, ptr, 7.0, waiter)
    assert (
        acl.rt.synchronize_stream_with_timeout(waiter, 200)
        == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    )
    assert acl.rt.stream_query(waiter) == (acl.ACL_STREAM_STATUS_NOT_READY, 0)
    assert acl.rt.record_notify(notify, recorder) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    assert _read(acl, ptr) == 7.0
    # the wait cleared it: a second wait needs a second record
    assert acl.rt.wait_and_reset_notify(notify, waiter, 0) == 0
    assert (
        acl.rt.synchronize_stream_with_timeout(waiter, 100)
        == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    )
    assert acl.rt.record_notify(notify, recorder) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    # a record before the wait is kept (a flag, not an event's latest record)
    assert acl.rt.record_notify(notify, recorder) == 0
    assert acl.rt.synchronize_stream(recorder) == 0
    assert acl.rt.wait_and_reset_notify(notify, waiter, 0) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    for stream in (waiter, recorder):
        assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(ptr) == 0
    assert acl.rt.destroy_notify(notify) == 0


def test_wait_timeout_is_reported_by_synchronize(acl):
    notify, _ = acl.rt.create_notify(0)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.wait_and_reset_notify(notify, stream, 1) == 0
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_WAIT_TIMEOUT
    assert "not recorded within 1 s" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0  # reported once; the stream goes on
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_notify(notify) == 0


def test_bad_notify_handles_and_flags(acl):
    assert acl.rt.create_notify(5) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    notify, _ = acl.rt.create_notify(acl.ACL_NOTIFY_DEVICE_USE_ONLY)
    assert acl.rt.destroy_notify(notify) == 0
    assert acl.rt.destroy_notify(notify) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.record_notify(notify, 0) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.wait_and_reset_notify(12345, 0, 0) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.notify_get_export_key(notify, 0) == ("", codes.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.rt.notify_import_by_key("nothing", 0) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.notify_import_by_key("", 0) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    other, _ = acl.rt.create_notify(0)
    assert acl.rt.notify_get_export_key(other, 1)[1] == codes.ACL_ERROR_RT_PARAM_INVALID
    assert (
        acl.rt.notify_set_import_pid(other, [1]) == codes.ACL_ERROR_RT_PARAM_INVALID
    )  # not exported
    key, ret = acl.rt.notify_get_export_key(other, 0)
    assert ret == 0 and 0 < len(key) < 65
    assert acl.rt.notify_set_import_pid(other, []) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.notify_set_import_pid(other, [-3]) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.notify_import_by_key(key, 0) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)  # own key
    assert acl.rt.destroy_notify(other) == 0
    assert acl.rt.notify_import_by_key(key, 0) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)  # gone


IMPORTER = """
    import acl, sys
    assert acl.rt.set_device(0) == 0
    pid, ret = acl.rt.device_get_bare_tgid()
    print(pid, flush=True)
    key = sys.stdin.readline().strip()
    notify, ret = acl.rt.notify_import_by_key(key, {flags})
    print(notify != 0, ret, flush=True)
    if ret == 0:
        assert acl.rt.record_notify(notify, 0) == 0
        assert acl.rt.synchronize_stream(0) == 0
        print(acl.rt.destroy_notify(notify), flush=True)
"""


def test_a_notify_shared_with_another_process(daemon, acl):
    """The runtime's IPC notify sample: A exports and waits, B imports and records."""
    notify, _ = acl.rt.create_notify(0)
    stream, _ = acl.rt.create_stream()
    key, ret = acl.rt.notify_get_export_key(notify, acl.ACL_RT_NOTIFY_EXPORT_FLAG_DEFAULT)
    assert ret == 0
    refused = run_client(
        daemon.address, IMPORTER.format(flags=0).replace("sys.stdin.readline().strip()", repr(key))
    )
    assert refused.stdout.split("\n")[1] == f"False {codes.ACL_ERROR_RT_NO_PERMISSION}", (
        refused.stderr
    )
    assert acl.rt.wait_and_reset_notify(notify, stream, 0) == 0
    importer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(IMPORTER.format(flags=2))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )
    try:
        pid = int(importer.stdout.readline())
        assert acl.rt.notify_set_import_pid(notify, [pid]) == 0
        importer.stdin.write(key + "\n")
        importer.stdin.flush()
        out, err = importer.communicate(timeout=120)
    finally:
        importer.kill()
    assert out.split() == ["True", "0", "0"], err
    assert acl.rt.synchronize_stream(stream) == 0  # B's record released A's wait
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_notify(notify) == 0


def test_a_notify_open_to_any_process_and_a_crashing_importer(daemon, acl):
    notify, _ = acl.rt.create_notify(0)
    key, ret = acl.rt.notify_get_export_key(
        notify, acl.ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION
    )
    assert ret == 0
    crash = f"""
        import acl, os
        assert acl.rt.set_device(0) == 0
        notify, ret = acl.rt.notify_import_by_key({key!r}, 0)
        assert ret == 0
        stream, _ = acl.rt.create_stream()
        assert acl.rt.wait_and_reset_notify(notify, stream, 0) == 0
        os._exit(3)  # ends with a wait queued and the notify held
    """
    assert run_client(daemon.address, crash).returncode == 3
    # until the daemon has ended the importer's session, its queued wait may still run and
    # take the record below (its process being gone is news the daemon gets later)
    _until_only_this_process_is_served(daemon)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.record_notify(notify, stream) == 0
    assert acl.rt.wait_and_reset_notify(notify, stream, 5) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_notify(notify) == 0
