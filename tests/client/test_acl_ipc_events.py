"""IPC events through acl (aclrtIpcGetEventHandle, aclrtIpcOpenEventHandle): an event one
process records and another waits for, synchronizes and queries, against a real daemon."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import time

from conftest import GATE, run_client

from simnpu.proto import codes

PARAM = codes.ACL_ERROR_RT_PARAM_INVALID
NOT_SUPPORTED = codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT


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


def test_handle_of_an_ipc_event_and_what_such_an_event_refuses(acl):
    event, ret = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    assert ret == 0
    handle, ret = acl.rt.ipc_get_event_handle(event)
    assert ret == 0 and isinstance(handle, bytes) and len(handle) == 64
    assert acl.rt.ipc_get_event_handle(event) == (handle, 0)  # the same at every call
    stream, _ = acl.rt.create_stream()
    # never recorded: complete, and a synchronize returns at once
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    assert acl.rt.synchronize_event(event) == 0
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.synchronize_event(event) == 0
    # what the runtime does not take for IPC events
    assert acl.rt.reset_event(event, stream) == NOT_SUPPORTED
    assert acl.rt.query_event(event) == (acl.ACL_EVENT_STATUS_COMPLETE, NOT_SUPPORTED)
    assert acl.rt.event_elapsed_time(event, event)[1] == NOT_SUPPORTED
    assert acl.rt.event_get_timestamp(event)[1] == NOT_SUPPORTED
    assert "not supported for IPC events" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0  # nothing was rejected later
    # ACL_EVENT_IPC is used alone
    assert acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC | acl.ACL_EVENT_SYNC)[1] == PARAM
    # only an IPC event has a handle; a bad event handle is 107017
    plain, _ = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    assert acl.rt.ipc_get_event_handle(plain) == (b"", PARAM)
    assert "ACL_EVENT_IPC" in acl.get_recent_err_msg()
    assert acl.rt.ipc_get_event_handle(0)[1] == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.ipc_get_event_handle(stream)[1] == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.destroy_event(plain) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.ipc_get_event_handle(event)[1] == codes.ACL_ERROR_RT_INVALID_HANDLE
    # the destroyed event's handle opens no more
    assert acl.rt.ipc_open_event_handle(handle) == (0, PARAM)
    assert acl.rt.destroy_stream(stream) == 0


def test_bad_handles_to_open(acl):
    assert acl.rt.ipc_open_event_handle(bytes(64)) == (0, PARAM)  # forged
    assert acl.rt.ipc_open_event_handle(b"\x01" * 64) == (0, PARAM)
    assert acl.rt.ipc_open_event_handle(b"short") == (0, PARAM)
    assert acl.rt.ipc_open_event_handle(b"") == (0, PARAM)
    assert acl.rt.ipc_open_event_handle(bytes(65)) == (0, PARAM)
    assert "64 bytes" in acl.get_recent_err_msg()
    for wrong in (None, 5, "x" * 64):
        try:
            acl.rt.ipc_open_event_handle(wrong)
        except TypeError:
            pass
        else:
            raise AssertionError(f"{wrong!r} was taken as a handle")


def test_opened_in_the_same_process(acl):
    event, _ = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    handle, _ = acl.rt.ipc_get_event_handle(event)
    opened, ret = acl.rt.ipc_open_event_handle(handle)
    assert ret == 0 and opened != event
    assert acl.rt.ipc_get_event_handle(opened) == (handle, 0)
    stream, _ = acl.rt.create_stream()
    release = hold(acl, stream)
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.query_event_status(opened) == (acl.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
    assert acl.rt.synchronize_event_with_timeout(opened, 100) == (
        codes.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
    )
    release()
    assert acl.rt.synchronize_event(opened) == 0
    assert acl.rt.query_event_status(opened) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    assert acl.rt.destroy_event(opened) == 0
    assert acl.rt.destroy_event(opened) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.query_event_status(event)[1] == 0  # the exporter's event is untouched
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


# The other process: opens the handle it reads on stdin, reports the status of the event,
# waits for it on a stream of its own, then (told so) records it itself.
OPENER = """
import sys
import acl

assert acl.init() == 0 and acl.rt.set_device(0) == 0
handle = bytes.fromhex(sys.stdin.readline().strip())
event, ret = acl.rt.ipc_open_event_handle(handle)
print("opened", ret, flush=True)
stream, _ = acl.rt.create_stream()
print("status", acl.rt.query_event_status(event)[0], flush=True)
assert acl.rt.stream_wait_event(stream, event) == 0
print("waited", acl.rt.synchronize_stream(stream), flush=True)
print("synchronized", acl.rt.synchronize_event(event), flush=True)
print("status", acl.rt.query_event_status(event)[0], flush=True)
sys.stdin.readline()  # the exporter destroyed its event
print("again", acl.rt.ipc_open_event_handle(handle)[1], flush=True)
assert acl.rt.record_event(event, stream) == 0  # an opened event still records
print("recorded", acl.rt.synchronize_event(event), flush=True)
print("reset", acl.rt.reset_event(event, stream), flush=True)
print("destroyed", acl.rt.destroy_event(event), flush=True)
print("destroyed", acl.rt.destroy_event(event), flush=True)
acl.rt.destroy_stream(stream)
acl.rt.reset_device(0)
acl.finalize()
"""


def test_recorded_in_one_process_waited_for_in_another(daemon, acl):
    event, _ = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    handle, _ = acl.rt.ipc_get_event_handle(event)
    stream, _ = acl.rt.create_stream()
    release = hold(acl, stream)
    assert acl.rt.record_event(event, stream) == 0  # held behind the gate
    opener = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OPENER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )
    try:
        assert opener.stdin is not None and opener.stdout is not None
        opener.stdin.write(handle.hex() + "\n")
        opener.stdin.flush()
        assert opener.stdout.readline().split() == ["opened", "0"]
        status = acl.ACL_EVENT_RECORDED_STATUS_NOT_READY
        assert opener.stdout.readline().split() == ["status", str(status)]
        release()  # the record runs: the other process's wait passes
        assert opener.stdout.readline().split() == ["waited", "0"]
        assert opener.stdout.readline().split() == ["synchronized", "0"]
        status = acl.ACL_EVENT_RECORDED_STATUS_COMPLETE
        assert opener.stdout.readline().split() == ["status", str(status)]
        assert acl.rt.destroy_event(event) == 0
        opener.stdin.write("go\n")
        opener.stdin.flush()
        out, err = opener.communicate(timeout=120)
    finally:
        if opener.poll() is None:
            opener.kill()
            opener.wait()
    assert opener.returncode == 0, err
    assert out.split("\n")[:-1] == [
        f"again {PARAM}",
        "recorded 0",
        f"reset {NOT_SUPPORTED}",
        "destroyed 0",
        f"destroyed {codes.ACL_ERROR_RT_INVALID_HANDLE}",
    ]
    assert acl.rt.destroy_stream(stream) == 0


def test_a_record_of_the_opener_is_what_the_exporter_waits_for(daemon, acl):
    event, _ = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    handle, _ = acl.rt.ipc_get_event_handle(event)
    recorder = f"""
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        event, ret = acl.rt.ipc_open_event_handle(bytes.fromhex({handle.hex()!r}))
        assert ret == 0
        stream, _ = acl.rt.create_stream()
        assert acl.rt.record_event(event, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        # it ends without destroying the event: the daemon forgets its handle
    """
    result = run_client(daemon.address, recorder)
    assert result.returncode == 0, result.stderr
    assert acl.rt.query_event_status(event) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    assert acl.rt.synchronize_event(event) == 0
    # a process that opens it and crashes harms nobody
    crash = f"""
        import os
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        event, ret = acl.rt.ipc_open_event_handle(bytes.fromhex({handle.hex()!r}))
        assert ret == 0
        os._exit(3)
    """
    assert run_client(daemon.address, crash).returncode == 3
    stream, _ = acl.rt.create_stream()
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.stream_wait_event(stream, event) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.synchronize_event(event) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_destroying_the_context_withdraws_the_handle(daemon, acl):
    default, _ = acl.rt.get_context()
    context, _ = acl.rt.create_context(0)
    event, _ = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    handle, _ = acl.rt.ipc_get_event_handle(event)
    opened, ret = acl.rt.ipc_open_event_handle(handle)
    assert ret == 0
    assert acl.rt.destroy_context(context) == 0
    assert acl.rt.query_event_status(opened)[1] == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.set_context(default) == 0
    assert acl.rt.ipc_open_event_handle(handle) == (0, PARAM)
    opener = f"""
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        print(acl.rt.ipc_open_event_handle(bytes.fromhex({handle.hex()!r}))[1])
    """
    result = run_client(daemon.address, opener)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(PARAM)]


def test_an_exporter_that_ends_withdraws_its_handle(daemon, acl):
    exporter = """
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        event, _ = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
        handle, ret = acl.rt.ipc_get_event_handle(event)
        assert ret == 0
        print(handle.hex())
        # it ends without destroying the event
    """
    result = run_client(daemon.address, exporter)
    assert result.returncode == 0, result.stderr
    handle = bytes.fromhex(result.stdout.strip())
    assert len(handle) == 64
    deadline = time.monotonic() + 60  # the daemon learns of the end when the stream ends
    while (opened := acl.rt.ipc_open_event_handle(handle)) != (0, PARAM):
        assert opened[1] == 0 and acl.rt.destroy_event(opened[0]) == 0
        assert time.monotonic() < deadline, "the ended exporter's handle still opens"
        time.sleep(0.05)


def test_an_opened_event_reports_its_own_context_failure(daemon, acl):
    """A stopped context of the exporter (ACL_STOP_ON_FAILURE) is not the opener's."""
    event, _ = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    handle, _ = acl.rt.ipc_get_event_handle(event)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE) == 0
    func, _ = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "fill_f32")
    args = struct.pack("<QfI", 0x10, 1.0, 4)  # no such memory: the launch fails
    assert (
        acl.rt.launch_kernel_with_host_args(
            func, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.synchronize_event(event) != 0  # the exporter's context stopped
    opener = f"""
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        event, ret = acl.rt.ipc_open_event_handle(bytes.fromhex({handle.hex()!r}))
        assert ret == 0
        print(acl.rt.synchronize_event(event), acl.rt.query_event_status(event)[1])
    """
    result = run_client(daemon.address, opener)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"]
    assert acl.rt.destroy_event(event) == 0
    acl.rt.synchronize_stream(stream)
    assert acl.rt.destroy_stream(stream) == 0
