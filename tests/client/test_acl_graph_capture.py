"""acl.mdl model run instances against a real daemon: stream capture, replay, fork/join,
capture-mode refusals, invalidation, destroy and abort, failures inside a replay,
introspection (docs/graph-capture.md)."""

from __future__ import annotations

import json
import random
import struct
import threading

import numpy as np
import pytest
from conftest import GATE, round_trip, runtime_of, start_client

from simnpu.client import facade
from simnpu.proto import commands

N = 256  # floats per buffer
NBYTES = N * 4
FAILS = """
from simnpu import kernel

@kernel("ptr")
def fails(ctx, x):
    raise ValueError("this kernel always fails")
"""


@pytest.fixture
def kit(acl):
    """Buffers, the built-in add_f32 and a helper to launch it, pinned memory; freed after."""
    add, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
    assert ret == 0
    made: list[int] = []

    class Kit:
        def buffer(self, values=None):
            ptr, ret = acl.rt.malloc(NBYTES, 0)
            assert ret == 0
            made.append(ptr)
            self.write(ptr, np.zeros(N, np.float32) if values is None else values)
            return ptr

        def write(self, ptr, values):
            data = np.ascontiguousarray(values, np.float32).tobytes()
            assert acl.rt.memcpy(ptr, NBYTES, acl.util.bytes_to_ptr(data), NBYTES, 1) == 0

        def read(self, ptr):
            out = bytes(NBYTES)
            assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), NBYTES, ptr, NBYTES, 2) == 0
            return np.frombuffer(out, np.float32).copy()

        def add(self, x, y, z, stream, blocks=1):
            args = struct.pack("<QQQI", x, y, z, N)
            return acl.rt.launch_kernel_with_host_args(
                add, blocks, stream, None, acl.util.bytes_to_ptr(args), len(args)
            )

    yield Kit()
    for ptr in made:
        acl.rt.free(ptr)


def _gate(acl) -> tuple[int, int, int]:
    """(the gate kernel, its flag in device memory (0: closed), its binary)."""
    binary, _ = acl.rt.binary_load_from_data(GATE, None)
    gate, _ = acl.rt.binary_get_function(binary, "gate")
    flag, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset(flag, 64, 0, 64) == 0
    return gate, flag, binary


def _open(acl, flag: int) -> None:
    one = struct.pack("<i", 1)
    assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0


def capture(acl, stream, mode=0):
    assert acl.mdl.ri_capture_begin(stream, mode) == 0


def end(acl, stream):
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0, acl.get_recent_err_msg()
    return model


def test_capture_records_instead_of_running_and_replays_on_demand(acl, kit):
    stream, _ = acl.rt.create_stream()
    x = kit.buffer(np.arange(N))
    y = kit.buffer()
    capture(acl, stream)
    assert kit.add(x, y, y, stream) == 0  # y += x
    assert acl.rt.memcpy_async(x, NBYTES, y, NBYTES, 3, stream) == 0  # x = y
    assert acl.rt.memset_async(y, 8, 0, 8, stream) == 0  # y[0:2] = 0
    status, model, ret = acl.mdl.ri_capture_get_info(stream)
    assert (status, ret) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, 0) and model
    assert end(acl, stream) == model
    assert acl.mdl.ri_capture_get_info(stream) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_NONE, 0, 0)
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(kit.read(x), np.arange(N, dtype=np.float32))  # nothing ran
    assert not kit.read(y).any()
    expected_x, expected_y = np.arange(N, dtype=np.float32), np.zeros(N, np.float32)
    for _ in range(3):
        assert acl.mdl.ri_execute_async(model, stream) == 0
        expected_y += expected_x
        expected_x = expected_y.copy()
        expected_y[:2] = 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(kit.read(x), expected_x)
    assert np.array_equal(kit.read(y), expected_y)
    assert acl.mdl.ri_execute(model, -1) == 0  # blocking, on a private stream
    expected_y += expected_x
    assert np.array_equal(kit.read(x), expected_y)
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.mdl.ri_execute_async(model, stream) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.destroy_stream(stream) == 0


def test_an_empty_capture_replays_as_nothing(acl):
    stream, _ = acl.rt.create_stream()
    capture(acl, stream)
    model = end(acl, stream)
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.mdl.ri_execute(model, 1000) == 0
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_stream(stream) == 0


# ---- capture/replay equivalence on random task graphs ------------------------------------------
def _program(seed: int, streams: int, ops: int) -> list[tuple]:
    """A random task graph over `streams` streams, as steps: each stream writes only its own
    two buffers; data crosses streams through a handshake (record, wait, copy, record back,
    wait back), so the result never depends on timing."""
    rng = random.Random(seed)
    steps: list[tuple] = [("fork",)]
    for _ in range(ops):
        s = rng.randrange(streams)
        kind = rng.choice(["add", "add", "copy", "memset", "host", "transfer"])
        if kind == "add":
            steps.append(("add", s, rng.randrange(2), rng.randrange(2), rng.randrange(2)))
        elif kind == "copy":
            steps.append(("copy", s, rng.randrange(2)))
        elif kind == "memset":
            steps.append(("memset", s, rng.randrange(2), rng.randrange(256), rng.randrange(1, N)))
        elif kind == "host":
            steps.append(("host", s, rng.randrange(1000)))
        elif streams > 1:
            t = (s + 1 + rng.randrange(streams - 1)) % streams
            steps.append(("transfer", s, t, rng.randrange(2), rng.randrange(2)))
    steps.append(("join",))
    return steps


def _run(acl, kit, steps, streams, buffers, events, calls):
    """Submit `steps` on `streams` (index 0 is the origin)."""
    origin = streams[0]
    for step in steps:
        kind = step[0]
        if kind == "fork":
            assert acl.rt.record_event(events[0], origin) == 0
            for stream in streams[1:]:
                assert acl.rt.stream_wait_event(stream, events[0]) == 0
        elif kind == "join":
            for index, stream in enumerate(streams[1:], 1):
                assert acl.rt.record_event(events[index], stream) == 0
                assert acl.rt.stream_wait_event(origin, events[index]) == 0
        elif kind == "add":
            _, s, a, b, c = step
            assert kit.add(buffers[s][a], buffers[s][b], buffers[s][c], streams[s]) == 0
        elif kind == "copy":
            _, s, a = step
            src, dst = buffers[s][a], buffers[s][1 - a]
            assert acl.rt.memcpy_async(dst, NBYTES, src, NBYTES, 3, streams[s]) == 0
        elif kind == "memset":
            _, s, a, value, count = step
            assert acl.rt.memset_async(buffers[s][a], NBYTES, value, count, streams[s]) == 0
        elif kind == "host":
            _, s, tag = step
            assert acl.rt.launch_host_func(streams[s], calls.append, (s, tag)) == 0
        else:
            _, s, t, a, b = step
            there, back = events[len(streams)], events[len(streams) + 1]
            assert acl.rt.record_event(there, streams[s]) == 0
            assert acl.rt.stream_wait_event(streams[t], there) == 0
            src, dst = buffers[s][a], buffers[t][b]
            assert acl.rt.memcpy_async(dst, NBYTES, src, NBYTES, 3, streams[t]) == 0
            assert acl.rt.record_event(back, streams[t]) == 0
            assert acl.rt.stream_wait_event(streams[s], back) == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_equals_eager_execution_bit_for_bit(acl, kit, seed):
    count = 3
    steps = _program(seed, count, 40)
    streams = [acl.rt.create_stream()[0] for _ in range(count)]
    events = [acl.rt.create_event()[0] for _ in range(count + 2)]
    rng = np.random.default_rng(seed)
    initial = [[rng.standard_normal(N).astype(np.float32) for _ in range(2)] for _ in streams]
    buffers = [[kit.buffer(values) for values in pair] for pair in initial]

    def reset():
        for pair, values in zip(buffers, initial):
            for ptr, data in zip(pair, values):
                kit.write(ptr, data)

    eager_calls: list = []
    for _ in range(2):
        _run(acl, kit, steps, streams, buffers, events, eager_calls)
    assert acl.rt.synchronize_device() == 0
    eager = [kit.read(ptr) for pair in buffers for ptr in pair]

    reset()
    replay_calls: list = []
    capture(acl, streams[0])
    _run(acl, kit, steps, streams, buffers, events, replay_calls)
    model = end(acl, streams[0])
    assert replay_calls == []
    assert [kit.read(ptr) for pair in buffers for ptr in pair][0].tobytes() == initial[0][
        0
    ].tobytes()
    for _ in range(2):
        assert acl.mdl.ri_execute_async(model, streams[0]) == 0
    assert acl.rt.synchronize_stream(streams[0]) == 0, acl.get_recent_err_msg()
    replayed = [kit.read(ptr) for pair in buffers for ptr in pair]
    assert [a.tobytes() for a in replayed] == [e.tobytes() for e in eager]
    for s in range(count):  # each stream's host functions ran in its order, twice
        assert [c for c in replay_calls if c[0] == s] == [c for c in eager_calls if c[0] == s]
    model_streams, ret = acl.mdl.ri_get_streams(model)
    assert ret == 0 and len(model_streams) == count
    assert acl.mdl.ri_destroy(model) == 0
    for event in events:
        assert acl.rt.destroy_event(event) == 0
    for stream in streams:
        assert acl.rt.destroy_stream(stream) == 0


def test_replays_on_several_streams_run_at_once(acl, kit):
    """Two replays of one model on two streams: the second runs while the first is held."""
    gate, flag, binary = _gate(acl)
    held, free = acl.rt.create_stream()[0], acl.rt.create_stream()[0]
    x, y = kit.buffer(np.ones(N)), kit.buffer()
    capture(acl, held)
    assert kit.add(x, y, y, held) == 0
    model = end(acl, held)
    args = struct.pack("<Qd", flag, 60.0)
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, held, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert acl.mdl.ri_execute_async(model, held) == 0  # waits behind the gate
    assert acl.mdl.ri_execute_async(model, free) == 0
    assert acl.rt.synchronize_stream(free) == 0
    assert np.array_equal(kit.read(y), np.ones(N, np.float32))  # one replay ran
    _open(acl, flag)
    assert acl.rt.synchronize_stream(held) == 0
    assert np.array_equal(kit.read(y), 2 * np.ones(N, np.float32))
    assert acl.mdl.ri_destroy(model) == 0
    acl.rt.free(flag)
    acl.rt.binary_unload(binary)


# ---- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mode", ["ACL_MODEL_RI_CAPTURE_MODE_GLOBAL", "ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL"]
)
def test_unsafe_calls_are_refused_by_mode_and_thread(acl, kit, mode):
    """GLOBAL refuses aclrtMemcpy / aclrtMemset in every thread whose mode is not RELAXED;
    THREAD_LOCAL only in the capturing thread; RELAXED (exchanged) allows them."""
    mode = getattr(acl, mode)
    stream, _ = acl.rt.create_stream()
    x = kit.buffer()
    host = bytes(NBYTES)
    capture(acl, stream, mode)
    refused = acl.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT
    assert acl.rt.memset(x, NBYTES, 0, NBYTES) == refused
    assert acl.rt.memcpy(x, NBYTES, acl.util.bytes_to_ptr(host), NBYTES, 1) == refused
    assert "refused while a stream is being captured" in acl.get_recent_err_msg()
    other: list = []

    def elsewhere():
        acl.rt.set_device(0)
        other.append(acl.rt.memset(x, NBYTES, 0, NBYTES))
        other.append(acl.mdl.ri_capture_thread_exchange_mode(acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED))
        other.append(acl.rt.memset(x, NBYTES, 0, NBYTES))
        acl.rt.reset_device(0)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    first = refused if mode == acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL else 0
    assert other == [first, (acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL, 0), 0]
    old, ret = acl.mdl.ri_capture_thread_exchange_mode(acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    assert (old, ret) == (acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL, 0)
    assert acl.rt.memset(x, NBYTES, 0, NBYTES) == 0
    assert acl.mdl.ri_capture_thread_exchange_mode(old) == (
        acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
        0,
    )
    # an asynchronous copy from pageable memory becomes synchronous: refused (107041), and
    # on the capturing stream itself it cannot be captured at all (107000)
    other_stream, _ = acl.rt.create_stream()
    pageable = acl.util.bytes_to_ptr(host)
    assert (
        acl.rt.memcpy_async(x, NBYTES, pageable, NBYTES, 1, other_stream)
        == acl.ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC
    )
    assert (
        acl.rt.memcpy_async(x, NBYTES, pageable, NBYTES, 1, stream)
        == acl.ACL_ERROR_RT_PARAM_INVALID
    )
    model = end(acl, stream)  # refusals do not invalidate the capture
    assert acl.rt.memset(x, NBYTES, 0, NBYTES) == 0
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_stream(other_stream) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_relaxed_mode_refuses_nothing_but_synchronizing_the_stream(acl, kit):
    stream, _ = acl.rt.create_stream()
    x = kit.buffer()
    capture(acl, stream, acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    assert acl.rt.memset(x, NBYTES, 0, NBYTES) == 0
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    assert acl.rt.stream_query(stream)[1] == acl.ACL_ERROR_RT_STREAM_CAPTURED
    assert acl.rt.synchronize_device() == acl.ACL_ERROR_RT_STREAM_CAPTURED
    assert acl.rt.destroy_stream(stream) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    model = end(acl, stream)
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.synchronize_device() == 0
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_capture_state_errors(acl, kit):
    a, b = acl.rt.create_stream()[0], acl.rt.create_stream()[0]
    x = kit.buffer()
    assert acl.mdl.ri_capture_begin(a, 7) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_capture_begin(0x123456, 0) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_capture_end(a) == (0, acl.ACL_ERROR_RT_STREAM_NOT_CAPTURED)
    capture(acl, a)
    assert acl.mdl.ri_capture_begin(a, 0) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    # b is pulled in by waiting for an event recorded in the capture
    event, _ = acl.rt.create_event()
    assert acl.rt.record_event(event, a) == 0
    assert acl.rt.stream_wait_event(b, event) == 0
    status, model, _ = acl.mdl.ri_capture_get_info(b)
    assert status == acl.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE and model
    assert acl.mdl.ri_capture_end(b) == (0, acl.ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED)
    assert acl.mdl.ri_destroy(model) == acl.ACL_ERROR_RT_MODEL_CAPTURED
    assert acl.mdl.ri_execute_async(model, b) == acl.ACL_ERROR_RT_MODEL_CAPTURED
    assert kit.add(x, x, x, b) == 0
    # b was not joined back into a: the capture ends without a model
    assert acl.mdl.ri_capture_end(a) == (0, acl.ACL_ERROR_RT_STREAM_UNJOINED)
    assert acl.mdl.ri_capture_get_info(b) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_NONE, 0, 0)
    assert acl.mdl.ri_destroy(model) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.synchronize_stream(b) == 0  # it ran nothing, and is usable again
    # the wrong thread ends a GLOBAL capture: refused, and the capture is gone
    capture(acl, a)
    result: list = []

    def ender():
        acl.rt.set_device(0)
        result.append(acl.mdl.ri_capture_end(a))
        acl.rt.reset_device(0)

    thread = threading.Thread(target=ender)
    thread.start()
    thread.join()
    assert result == [(0, acl.ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD)]
    assert acl.mdl.ri_capture_get_info(a) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_NONE, 0, 0)
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(a) == 0
    assert acl.rt.destroy_stream(b) == 0


def test_a_refused_call_invalidates_the_capture(acl, kit):
    stream, _ = acl.rt.create_stream()
    x = kit.buffer()
    capture(acl, stream)
    assert kit.add(x, x, x, stream) == 0
    # a command the daemon refuses (an event handle the raw layer did not check first)
    connection = facade.session().connection
    connection.send_command(commands.RecordEvent.pack(0x1234, stream), "here", stream)
    status, model, ret = acl.mdl.ri_capture_get_info(stream)
    assert (status, ret) == (acl.ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED, 0) and model
    assert acl.mdl.ri_capture_end(stream) == (0, acl.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED)
    assert "invalidated" in acl.get_recent_err_msg()
    assert acl.mdl.ri_destroy(model) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_INVALID_HANDLE  # the refusal
    assert acl.rt.synchronize_stream(stream) == 0
    assert not kit.read(x).any()
    assert acl.rt.destroy_stream(stream) == 0


def test_bad_handles_and_null_arguments(acl):
    stream, _ = acl.rt.create_stream()
    bogus = 0x1234
    assert acl.mdl.ri_execute_async(bogus, stream) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_execute_async(0, stream) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_execute(bogus, -1) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_destroy(0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_abort(bogus) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_get_id(bogus) == (0, acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.mdl.ri_get_streams(0) == ([], acl.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.ri_get_tasks_by_stream(bogus) == ([], acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.mdl.ri_get_tasks_by_stream(stream) == ([], acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.mdl.ri_task_get_type(bogus) == (0, acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.mdl.ri_task_get_seq_id(0) == (0, acl.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.ri_capture_to_model_ri_begin(stream, bogus, 0) == (
        acl.ACL_ERROR_RT_INVALID_HANDLE
    )
    assert acl.mdl.ri_capture_thread_exchange_mode(9) == (0, acl.ACL_ERROR_INVALID_PARAM)
    with pytest.raises(TypeError):
        acl.mdl.ri_capture_begin(stream, "global")
    assert acl.rt.synchronize_stream(stream) == 0  # nothing was queued or rejected
    assert acl.rt.destroy_stream(stream) == 0


def test_a_replay_cannot_be_captured_yet(acl):
    """A task kind that cannot be recorded invalidates the capture: the replay of a model
    (HCCL collectives are recorded: tests/integration/test_hccl_graphs.py)."""
    stream, _ = acl.rt.create_stream()
    capture(acl, stream)
    inner = end(acl, stream)
    capture(acl, stream)
    assert acl.mdl.ri_execute_async(inner, stream) == 0
    status, _, _ = acl.mdl.ri_capture_get_info(stream)
    assert status == acl.ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED
    assert acl.mdl.ri_capture_end(stream) == (0, acl.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED)
    assert "cannot be captured" in acl.get_recent_err_msg()
    assert acl.mdl.ri_destroy(inner) == 0
    assert acl.rt.destroy_stream(stream) == 0


# ---- failures, destroy, abort -------------------------------------------------------------------
def test_a_failing_kernel_in_a_replay_names_its_capture_site(acl, kit):
    binary, _ = acl.rt.binary_load_from_data(FAILS, None)
    fails, _ = acl.rt.binary_get_function(binary, "fails")
    stream, _ = acl.rt.create_stream()
    x = kit.buffer()
    args = struct.pack("<Q", x)
    capture(acl, stream)
    ptr = acl.util.bytes_to_ptr(args)
    line = _line() + 1
    ret = acl.rt.launch_kernel_with_host_args(fails, 1, stream, None, ptr, 8)
    assert ret == 0
    model = end(acl, stream)
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    message = acl.get_recent_err_msg()
    assert "this kernel always fails" in message
    assert f"test_acl_graph_capture.py:{line}" in message
    assert acl.rt.synchronize_stream(stream) == 0  # reported once
    assert acl.mdl.ri_execute(model, -1) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_stream(stream) == 0
    acl.rt.binary_unload(binary)


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def test_destroy_while_captured_and_while_a_replay_runs(acl, kit):
    gate, flag, binary = _gate(acl)
    stream, _ = acl.rt.create_stream()
    args = struct.pack("<Qd", flag, 120.0)
    capture(acl, stream)
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    model = end(acl, stream)
    # only a model never captured takes a capture (a sub model of a cond task)
    assert acl.mdl.ri_capture_to_model_ri_begin(stream, model, 0) == (
        acl.ACL_ERROR_RT_MODEL_CAPTURED
    )
    other, _ = acl.rt.create_stream()
    capture(acl, other)
    _, capturing, _ = acl.mdl.ri_capture_get_info(other)
    assert acl.mdl.ri_destroy(capturing) == acl.ACL_ERROR_RT_MODEL_CAPTURED
    assert acl.mdl.ri_capture_to_model_ri_begin(stream, capturing, 0) == (
        acl.ACL_ERROR_RT_MODEL_CAPTURED
    )
    assert acl.mdl.ri_capture_begin(other, 0) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    assert end(acl, other) == capturing
    assert acl.mdl.ri_destroy(capturing) == 0
    assert acl.rt.destroy_stream(other) == 0
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.mdl.ri_destroy(model) == acl.ACL_ERROR_RT_MODEL_RUNNING  # after 10 s
    _open(acl, flag)
    assert acl.rt.synchronize_stream(stream) == 0
    destroyed: list = []
    assert acl.mdl.ri_destroy_register_callback(model, destroyed.append, "gone") == 0
    assert acl.mdl.ri_destroy(model) == 0
    assert destroyed == ["gone"]
    assert acl.rt.destroy_stream(stream) == 0
    acl.rt.free(flag)
    acl.rt.binary_unload(binary)


def test_abort_ends_a_running_replay(acl, kit):
    gate, flag, binary = _gate(acl)
    stream, _ = acl.rt.create_stream()
    x, y = kit.buffer(np.ones(N)), kit.buffer()
    args = struct.pack("<Qd", flag, 120.0)
    capture(acl, stream)
    assert (
        acl.rt.launch_kernel_with_host_args(
            gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        )
        == 0
    )
    assert kit.add(x, y, y, stream) == 0
    model = end(acl, stream)
    assert acl.mdl.ri_execute_async(model, stream) == 0  # queued: dropped whole
    assert acl.mdl.ri_abort(model) == 0
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_MODEL_ABORT_NORMAL
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.mdl.ri_get_id(model)[1] == 0  # answered after the replay started: it runs
    assert acl.mdl.ri_abort(model) == 0  # the gate is ended, the add dropped
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_MODEL_ABORT_NORMAL
    assert not kit.read(y).any()  # the add behind the gate never ran
    assert acl.mdl.ri_abort(model) == 0  # nothing runs: nothing to do
    _open(acl, flag)
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(kit.read(y), np.ones(N, np.float32))
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_stream(stream) == 0
    acl.rt.free(flag)
    acl.rt.binary_unload(binary)


# ---- introspection -------------------------------------------------------------------------------
def test_ids_names_streams_tasks_and_debug_prints(acl, kit, tmp_path, capsys):
    a, b = acl.rt.create_stream()[0], acl.rt.create_stream()[0]
    fork, join = acl.rt.create_event()[0], acl.rt.create_event()[0]
    x, y = kit.buffer(), kit.buffer()
    capture(acl, a)
    assert kit.add(x, x, x, a) == 0
    assert acl.rt.record_event(fork, a) == 0
    assert acl.rt.stream_wait_event(b, fork) == 0
    assert kit.add(y, y, y, b) == 0
    assert acl.rt.record_event(join, b) == 0
    assert acl.rt.stream_wait_event(a, join) == 0
    model = end(acl, a)
    first, ret = acl.mdl.ri_get_id(model)
    assert ret == 0 and first > 0
    capture(acl, a)
    other = end(acl, a)
    assert acl.mdl.ri_get_id(other)[0] != first
    assert acl.mdl.ri_get_name(model, 16) == ("", 0)
    assert acl.mdl.ri_set_name(model, "forward") == 0
    assert acl.mdl.ri_get_name(model, 16) == ("forward", 0)
    assert acl.mdl.ri_get_name(model, 7) == ("", acl.ACL_ERROR_INVALID_PARAM)
    streams, ret = acl.mdl.ri_get_streams(model)
    assert ret == 0 and len(streams) == 2
    types = []
    for stream in streams:
        tasks, ret = acl.mdl.ri_get_tasks_by_stream(stream)
        assert ret == 0
        types.append([acl.mdl.ri_task_get_type(task)[0] for task in tasks])
        assert [acl.mdl.ri_task_get_seq_id(task) for task in tasks] == [
            (i, 0) for i in range(len(tasks))
        ]
    assert types == [
        [
            acl.ACL_MODEL_RI_TASK_KERNEL,
            acl.ACL_MODEL_RI_TASK_EVENT_RECORD,
            acl.ACL_MODEL_RI_TASK_EVENT_WAIT,
        ],
        [
            acl.ACL_MODEL_RI_TASK_EVENT_WAIT,
            acl.ACL_MODEL_RI_TASK_KERNEL,
            acl.ACL_MODEL_RI_TASK_EVENT_RECORD,
        ],
    ]
    path = tmp_path / "graph.json"
    assert (
        acl.mdl.ri_debug_json_print(model, str(path), acl.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE) == 0
    )
    dump = json.loads(path.read_text())
    assert dump["name"] == "forward" and dump["tasks"] == 6
    assert [task["name"] for task in dump["streams"][0]["task_list"]][0] == "add_f32"
    assert acl.mdl.ri_debug_json_print(model, str(path), 5) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_debug_json_print(model, str(tmp_path / "no" / "x.json"), 0) == (
        acl.ACL_ERROR_INVALID_PARAM
    )
    capsys.readouterr()
    assert acl.mdl.ri_debug_print(model) == 0
    assert json.loads(capsys.readouterr().out)["model_id"] == first
    calls: list = []
    assert acl.mdl.ri_destroy_register_callback(model, calls.append, 1) == 0
    assert acl.mdl.ri_destroy_register_callback(model, calls.extend, [2, 3]) == 0
    assert acl.mdl.ri_destroy_unregister_callback(model, calls.extend) == 0
    assert acl.mdl.ri_destroy_unregister_callback(model, calls.extend) == (
        acl.ACL_ERROR_INVALID_PARAM
    )
    assert acl.mdl.ri_destroy(model) == 0
    assert calls == [1]
    assert acl.mdl.ri_get_tasks_by_stream(streams[0]) == ([], acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.mdl.ri_destroy(other) == 0
    for event in (fork, join):
        assert acl.rt.destroy_event(event) == 0
    for stream in (a, b):
        assert acl.rt.destroy_stream(stream) == 0


KILLED_CLIENT = """
import struct, sys, time
import acl
from conftest_gate import GATE

acl.init()
acl.rt.set_device(0)
stream, _ = acl.rt.create_stream()
binary, _ = acl.rt.binary_load_from_data(GATE, None)
gate, _ = acl.rt.binary_get_function(binary, "gate")
flag, _ = acl.rt.malloc(64, 0)
acl.rt.memset(flag, 64, 0, 64)
args = struct.pack("<Qd", flag, 5.0)  # the gate fails after 5 s: the session can end
acl.mdl.ri_capture_begin(stream, 0)
acl.rt.launch_kernel_with_host_args(gate, 1, stream, None, acl.util.bytes_to_ptr(args), len(args))
acl.rt.memset_async(flag, 64, 0, 64, stream)
model, ret = acl.mdl.ri_capture_end(stream)
assert ret == 0
for _ in range(3):
    acl.mdl.ri_execute_async(model, stream)
acl.mdl.ri_get_id(model)  # answered once the first replay runs
print("replaying", flush=True)
time.sleep(300)
"""


def test_a_client_killed_while_its_graph_replays_leaves_nothing(daemon, tmp_path):
    """Its replays' streams go with its session; the daemon serves the next client (the
    conftest checks that no segment or process is left)."""
    (tmp_path / "conftest_gate.py").write_text(f"GATE = {GATE!r}\n")
    process = start_client(daemon.address, KILLED_CLIENT, env={"PYTHONPATH": str(tmp_path)})
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "replaying", process.stderr.read()
    finally:
        process.kill()
        process.wait(30)
    with runtime_of(daemon.address) as rt:
        round_trip(rt)
