"""acl.rt stream control against a real daemon (1 device, 2 AI cores): stream_abort and
stream_stop end a running kernel (and an abort the queued tasks), stream resource limits
(their precedence over the process's and the thread's use of them), and an event wait
task's own timeout."""

from __future__ import annotations

import struct
import threading
import time

import numpy as np

KERNELS = """
import time
from simnpu import kernel

@kernel("ptr", "ptr")
def hold(ctx, flag, started):
    ctx.gm(started, "int32", 1)[0] = 1
    view = ctx.gm(flag, "int32", 1, access="r")
    deadline = time.monotonic() + 60
    while view[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.0002)

@kernel("ptr", "u32")
def store(ctx, out, value):
    ctx.gm(out, "uint32", 1)[0] = value

@kernel("ptr")
def which_core(ctx, out):
    ctx.gm(out + 4 * ctx.block_idx, "uint32", 1)[0] = ctx.core_id
"""
BLOCKS = 64
ABORTED = 107023  # ACL_ERROR_RT_STREAM_ABORT


def _launch(acl, function, blocks, stream, args: bytes) -> None:
    assert (
        acl.rt.launch_kernel_with_host_args(
            function, blocks, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )


def _read_u32(acl, ptr, count: int = 1) -> list[int]:
    host = bytes(4 * count)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(host), len(host), ptr, len(host), 2) == 0
    return np.frombuffer(host, dtype=np.uint32).tolist()


class Kernels:
    """`hold` (runs up to 60 s, until `open`), `store` and `which_core`."""

    def __init__(self, acl):
        self.acl = acl
        self.binary, _ = acl.rt.binary_load_from_data(KERNELS)
        self.hold_fn, _ = acl.rt.binary_get_function(self.binary, "hold")
        self.store, _ = acl.rt.binary_get_function(self.binary, "store")
        self.which_core, _ = acl.rt.binary_get_function(self.binary, "which_core")
        self.flag, _ = acl.rt.malloc(8, 0)
        self.out, _ = acl.rt.malloc(4 * BLOCKS, 0)
        assert acl.rt.memset(self.flag, 8, 0, 8) == 0
        assert acl.rt.memset(self.out, 4 * BLOCKS, 0, 4 * BLOCKS) == 0

    def hold(self, stream) -> None:
        _launch(self.acl, self.hold_fn, 1, stream, struct.pack("<QQ", self.flag, self.flag + 4))

    def running(self) -> None:
        """Until the `hold` launched last runs on a core."""
        for _ in range(6000):
            if _read_u32(self.acl, self.flag + 4) == [1]:
                assert self.acl.rt.memset(self.flag + 4, 4, 0, 4) == 0
                return
            time.sleep(0.01)
        raise AssertionError("the hold kernel never started")

    def open(self) -> None:
        one = struct.pack("<i", 1)
        assert self.acl.rt.memcpy(self.flag, 4, self.acl.util.bytes_to_ptr(one), 4, 1) == 0

    def put(self, stream, value: int) -> None:
        _launch(self.acl, self.store, 1, stream, struct.pack("<QI", self.out, value))

    def cores_used(self, stream) -> set[int]:
        _launch(self.acl, self.which_core, BLOCKS, stream, struct.pack("<Q", self.out))
        assert self.acl.rt.synchronize_stream(stream) == 0
        return set(_read_u32(self.acl, self.out, BLOCKS))

    def close(self) -> None:
        acl = self.acl
        assert acl.rt.free(self.flag) == 0 and acl.rt.free(self.out) == 0
        assert acl.rt.binary_unload(self.binary) == 0


# ---- aclrtStreamAbort / aclrtStreamStop ------------------------------------------------------
def test_abort_ends_the_running_kernel_and_drops_the_queue(acl):
    k = Kernels(acl)
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    k.put(stream, 1)
    assert acl.rt.synchronize_stream(stream) == 0
    k.hold(stream)  # would run 60 s
    k.put(stream, 2)  # queued: discarded
    assert acl.rt.record_event(event, stream) == 0  # queued: fires anyway
    k.running()
    assert acl.rt.stream_abort(stream) == 0
    assert acl.rt.synchronize_event(event) == 0
    assert acl.rt.synchronize_stream(stream) == ABORTED  # once
    assert "aclrtStreamAbort" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.stream_query(stream) == (acl.ACL_STREAM_STATUS_COMPLETE, 0)
    assert _read_u32(acl, k.out) == [1]
    k.put(stream, 3)  # the stream works as before
    assert acl.rt.synchronize_stream(stream) == 0
    assert _read_u32(acl, k.out) == [3]
    assert acl.rt.stream_abort(stream) == 0  # nothing to end: nothing reported
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0
    k.close()


def test_stop_ends_the_running_kernel_and_keeps_the_queue(acl):
    k = Kernels(acl)
    stream, _ = acl.rt.create_stream_with_config(0, acl.ACL_STREAM_DEVICE_USE_ONLY)
    k.hold(stream)
    k.put(stream, 7)  # queued: runs after the stop
    k.running()
    assert acl.rt.stream_stop(stream) == 0
    assert acl.rt.synchronize_stream(stream) == ABORTED
    assert "aclrtStreamStop" in acl.get_recent_err_msg()
    assert _read_u32(acl, k.out) == [7]
    k.put(stream, 8)
    assert acl.rt.synchronize_stream(stream) == 0
    assert _read_u32(acl, k.out) == [8]
    assert acl.rt.destroy_stream(stream) == 0
    k.close()


def test_abort_of_the_default_stream_and_bad_input(acl):
    k = Kernels(acl)
    k.hold(0)
    k.running()
    assert acl.rt.stream_abort(0) == 0  # null: the default stream
    assert acl.rt.synchronize_stream(0) == ABORTED
    assert acl.rt.synchronize_device() == 0
    assert acl.rt.stream_stop(0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.stream_abort(12345) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.stream_stop(12345) == acl.ACL_ERROR_RT_INVALID_HANDLE
    stream, _ = acl.rt.create_stream()
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.stream_abort(stream) == acl.ACL_ERROR_RT_INVALID_HANDLE
    k.put(0, 5)  # the device still works
    assert acl.rt.synchronize_stream(0) == 0
    assert _read_u32(acl, k.out) == [5]
    k.close()


def test_abort_leaves_another_client_alone(acl, daemon):
    from conftest import run_client

    k = Kernels(acl)
    stream, _ = acl.rt.create_stream()
    k.hold(stream)
    k.running()
    other = run_client(
        daemon.address,
        """
        import acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        stream, _ = acl.rt.create_stream()
        assert acl.rt.stream_abort(stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.destroy_stream(stream) == 0
        assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
        """,
    )
    assert other.returncode == 0, other.stderr
    assert acl.rt.stream_query(stream) == (acl.ACL_STREAM_STATUS_NOT_READY, 0)  # still held
    k.open()
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0
    k.close()


# ---- stream resource limits --------------------------------------------------------------------
def test_stream_limits_are_enforced_and_win_over_the_process(acl):
    k = Kernels(acl)
    cube, vector = acl.ACL_RT_DEV_RES_CUBE_CORE, acl.ACL_RT_DEV_RES_VECTOR_CORE
    limited, _ = acl.rt.create_stream()
    free, _ = acl.rt.create_stream()
    assert acl.rt.get_stream_res_limit(limited, cube) == (2, 0)
    assert acl.rt.set_stream_res_limit(limited, vector, 1) == 0
    assert acl.rt.get_stream_res_limit(limited, vector) == (1, 0)
    assert acl.rt.get_stream_res_limit(limited, cube) == (2, 0)
    for _ in range(3):
        assert k.cores_used(limited) == {0}
    assert k.cores_used(free) <= {0, 1}
    # the process's limit applies where the stream has none; the stream's wins where it has
    assert acl.rt.set_device_res_limit(0, cube, 1) == 0
    assert acl.rt.set_stream_res_limit(free, cube, 2) == 0
    assert acl.rt.set_stream_res_limit(free, vector, 2) == 0
    assert acl.rt.get_stream_res_limit(free, cube) == (2, 0)
    other, _ = acl.rt.create_stream()
    assert acl.rt.get_stream_res_limit(other, cube) == (1, 0)
    assert acl.rt.get_stream_res_limit(0, cube) == (1, 0)  # the default stream
    for _ in range(3):
        assert k.cores_used(other) == {0}
    assert acl.rt.reset_stream_res_limit(free) == 0
    assert acl.rt.get_stream_res_limit(free, cube) == (1, 0)
    assert acl.rt.reset_device_res_limit(0) == 0
    assert acl.rt.get_stream_res_limit(free, cube) == (2, 0)
    assert acl.rt.get_stream_res_limit(limited, vector) == (1, 0)
    for stream in (limited, free, other):
        assert acl.rt.destroy_stream(stream) == 0
    k.close()


def test_stream_limits_bad_input(acl):
    stream, _ = acl.rt.create_stream()
    cube = acl.ACL_RT_DEV_RES_CUBE_CORE
    assert acl.rt.set_stream_res_limit(stream, cube, 0) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.set_stream_res_limit(stream, cube, 3) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.set_stream_res_limit(stream, 2, 1) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.get_stream_res_limit(stream, 9) == (0, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.get_stream_res_limit(12345, cube) == (0, acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.rt.set_stream_res_limit(12345, cube, 1) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.reset_stream_res_limit(12345) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.use_stream_res_in_current_thread(12345) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.get_stream_res_limit(stream, cube) == (2, 0)  # nothing was set
    assert acl.rt.destroy_stream(stream) == 0


def test_a_threads_launches_are_bounded_by_the_stream_it_uses(acl):
    k = Kernels(acl)
    vector = acl.ACL_RT_DEV_RES_VECTOR_CORE
    limits, _ = acl.rt.create_stream()
    free, _ = acl.rt.create_stream()
    assert acl.rt.set_stream_res_limit(limits, vector, 1) == 0
    assert acl.rt.use_stream_res_in_current_thread(limits) == 0
    for _ in range(3):
        assert k.cores_used(free) == {0}  # on a stream of no limits of its own
    seen = []
    context, _ = acl.rt.get_context()

    def other_thread():  # not using the limits: both cores
        acl.rt.set_context(context)
        seen.append(k.cores_used(free))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen and seen[0] <= {0, 1}
    assert acl.rt.unuse_stream_res_in_current_thread(limits) == 0
    assert k.cores_used(free) <= {0, 1}
    assert acl.rt.use_stream_res_in_current_thread(limits) == 0
    assert acl.rt.destroy_stream(limits) == 0  # gone: its limits bound nothing any more
    assert k.cores_used(free) <= {0, 1}
    assert acl.rt.destroy_stream(free) == 0
    k.close()


def test_a_thread_uses_a_streams_limits(acl):
    cube, vector = acl.ACL_RT_DEV_RES_CUBE_CORE, acl.ACL_RT_DEV_RES_VECTOR_CORE
    stream, _ = acl.rt.create_stream()
    assert acl.rt.set_stream_res_limit(stream, vector, 1) == 0
    assert acl.rt.use_stream_res_in_current_thread(stream) == 0
    assert acl.rt.get_res_in_current_thread(vector) == (1, 0)
    assert acl.rt.get_res_in_current_thread(cube) == (2, 0)
    seen = []
    context, _ = acl.rt.get_context()

    def other_thread():
        acl.rt.set_context(context)
        seen.append(acl.rt.get_res_in_current_thread(vector))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [(2, 0)]  # another thread reads the process's limits
    assert acl.rt.unuse_stream_res_in_current_thread(stream) == 0
    assert acl.rt.get_res_in_current_thread(vector) == (2, 0)
    assert acl.rt.use_stream_res_in_current_thread(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0  # a destroyed stream's limits no longer apply
    assert acl.rt.get_res_in_current_thread(vector) == (2, 0)


# ---- aclrtStreamWaitEventWithTimeout -----------------------------------------------------------
def test_a_wait_fails_after_its_timeout(acl):
    k = Kernels(acl)
    held, _ = acl.rt.create_stream()
    waiting, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    k.hold(held)
    assert acl.rt.record_event(event, held) == 0
    assert acl.rt.stream_wait_event_with_timeout(waiting, event, 1) == 0
    k.put(waiting, 4)  # runs after the failed wait
    assert acl.rt.synchronize_stream(waiting) == acl.ACL_ERROR_RT_WAIT_TIMEOUT
    assert "aclrtStreamWaitEventWithTimeout" in acl.get_recent_err_msg()
    assert _read_u32(acl, k.out) == [4]
    assert acl.rt.synchronize_stream(waiting) == 0
    k.open()
    assert acl.rt.synchronize_stream(held) == 0
    # recorded in time: the wait passes
    assert acl.rt.stream_wait_event_with_timeout(waiting, event, 30) == 0
    k.put(waiting, 6)
    assert acl.rt.synchronize_stream(waiting) == 0
    assert _read_u32(acl, k.out) == [6]
    assert acl.rt.stream_wait_event_with_timeout(waiting, 12345, 5) == 107017
    assert acl.rt.stream_wait_event_with_timeout(waiting, event, -1) == 107000
    assert acl.rt.synchronize_stream(waiting) == 0
    assert acl.rt.destroy_event(event) == 0
    for stream in (held, waiting):
        assert acl.rt.destroy_stream(stream) == 0
    k.close()
