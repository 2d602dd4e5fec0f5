"""Streams and events against a real daemon: stream order, concurrency between streams,
priorities, event record/wait/query/synchronize/elapsed time/reset, timeouts, stream
destruction, failure modes and the last-error slot.

Ordering is proved with kernels that wait for flags in device memory, never with
timing: a kernel that waits for something that can only happen in the situation under
test completes only if that situation happened (otherwise it gives up after LIMIT_S and
fails the task, so a broken scheduler fails the test instead of hanging it).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

LIMIT_S = 20.0  # how long a waiting kernel spins before it fails its task
FLAGS = 64  # int32 flags in the shared flag buffer

KERNELS = '''
import time

import numpy as np
from simnpu import kernel


def _spin_until_set(ctx, flags, index, limit):
    view = ctx.gm(flags, "int32", index + 1, access="r")
    deadline = time.monotonic() + limit
    while view[index] == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"flag {index} was not set within {limit} s")
        time.sleep(0.0002)


def _set(ctx, flags, index, value=1):
    ctx.gm(flags, "int32", index + 1)[index] = value


@kernel("ptr", "u32", "u32", "f64")
def gate(ctx, flags, started, release, limit):
    """flags[started] = 1, then wait until flags[release] is set."""
    _set(ctx, flags, started)
    _spin_until_set(ctx, flags, release, limit)


@kernel("ptr", "u32", "u32", "u32", "f64")
def rendezvous(ctx, flags, mine, other, core_slot, limit):
    """Set my flag, wait for the other kernel's, note my core: completes only if both overlap."""
    _set(ctx, flags, mine)
    _spin_until_set(ctx, flags, other, limit)
    _set(ctx, flags, core_slot, ctx.core_id + 1)


@kernel("ptr", "u32")
def signal(ctx, flags, index):
    _set(ctx, flags, index)


@kernel("ptr", "u32", "f32", "f64")
def slow_fill(ctx, x, n, value, seconds):
    """Sleep, then x[i] = value for this block's slice of [0, n)."""
    time.sleep(seconds)
    base, extra = divmod(n, ctx.block_num)
    start = ctx.block_idx * base + min(ctx.block_idx, extra)
    stop = start + base + (ctx.block_idx < extra)
    if stop > start:
        ctx.gm(x + 4 * start, "float32", stop - start)[:] = value


@kernel("ptr", "i32")
def log_id(ctx, log, ident):
    """Append `ident` to the log: log[0] counts the entries, log[1:] holds them."""
    view = ctx.gm(log, "int32", 16)
    slot = int(view[0]) + 1
    view[slot] = ident
    view[0] = slot


@kernel("ptr", "u32", "u32")
def fail_in_block(ctx, x, n, bad):
    """Raises in block `bad`; the other blocks write their index."""
    if ctx.block_idx == bad:
        raise ValueError(f"deliberate failure in block {bad}")
    ctx.gm(x, "int32", n)[ctx.block_idx] = ctx.block_idx


@kernel("f64")
def nap(ctx, seconds):
    time.sleep(seconds)
'''


class Kit:
    """The test kernels plus a zeroed flag buffer, and host-side helpers around them."""

    def __init__(self, npu):
        self.npu = npu
        self.module = npu.Module.from_source(KERNELS, "stream_kernels.py")
        for name in ("gate", "rendezvous", "signal", "slow_fill", "log_id", "fail_in_block", "nap"):
            setattr(self, name, self.module.function(name))
        self.flags = npu.DeviceBuffer(FLAGS * 4)
        self.flags.fill(0)

    def read_flags(self) -> np.ndarray:
        return self.flags.to_numpy(np.int32)

    def set_flag(self, index: int) -> None:
        """Set flags[index] from the host (synchronous aclrtMemset: not stream-ordered,
        done by a copy engine, so it works while every AI core is busy)."""
        self.npu.runtime().memory.memset(self.flags.ptr + 4 * index, 4, 1, 4)

    def wait_flag(self, index: int) -> None:
        deadline = time.monotonic() + LIMIT_S
        while self.read_flags()[index] == 0:
            assert time.monotonic() < deadline, f"flag {index} never set: the kernel did not start"
            time.sleep(0.005)

    def buffer(self, dtype, count, fill=0):
        buffer = self.npu.DeviceBuffer(np.dtype(dtype).itemsize * count)
        buffer.fill(fill)
        return buffer


@pytest.fixture
def kit(npu):
    with npu.Device(0):
        yield Kit(npu)


def f32(buffer) -> np.ndarray:
    return buffer.to_numpy(np.float32)


def call_site(offset: int = 1) -> str:
    """file:line of the caller's line + `offset` (where the next call is submitted)."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


# ---- stream order and concurrency ----------------------------------------------------------------


def test_tasks_of_one_stream_run_in_order(npu, kit):
    n = 10_007
    stream = npu.Stream()
    x, y, z, half = (npu.DeviceBuffer(4 * n) for _ in range(4))
    fill, add, mul = npu.builtin("fill_f32"), npu.builtin("add_f32"), npu.builtin("mul_f32")
    # A slow first producer: anything after it that ran early would read garbage.
    kit.slow_fill.launch(5, x, n, 1.5, 0.05, stream=stream)
    fill.launch(2, y, 2.0, n, stream=stream)
    fill.launch(1, half, 0.5, n, stream=stream)
    expected = {"x": np.full(n, 1.5, np.float32), "y": np.full(n, 2.0, np.float32)}
    for step in range(6):
        blocks = (1, 2, 5)[step % 3]
        add.launch(blocks, x, y, z, n, stream=stream)  # z = x + y
        mul.launch(blocks, z, half, x, n, stream=stream)  # x = z / 2
        fill.launch(blocks, y, float(step), n, stream=stream)  # y = step
        add.launch(blocks, y, x, y, n, stream=stream)  # y = step + x  (in place)
        expected["z"] = expected["x"] + expected["y"]
        expected["x"] = expected["z"] * np.float32(0.5)
        expected["y"] = np.float32(step) + expected["x"]
    # Copies on the same stream keep the order too.
    npu.runtime().memory.memcpy_async(
        z.ptr, z.nbytes, y.ptr, y.nbytes, codes.ACL_MEMCPY_DEVICE_TO_DEVICE, stream.handle
    )
    mul.launch(5, z, z, x, n, stream=stream)  # x = y * y
    stream.synchronize()
    np.testing.assert_array_equal(f32(x), expected["y"] * expected["y"])
    np.testing.assert_array_equal(f32(y), expected["y"])
    np.testing.assert_array_equal(f32(z), expected["y"])


def test_different_streams_run_concurrently_on_different_cores(npu, kit):
    """Each kernel waits for the other's flag: both complete only if they overlap."""
    assert npu.runtime().ai_cores >= 2
    one, two = npu.Stream(), npu.Stream()
    kit.rendezvous.launch(1, kit.flags, 0, 1, 10, LIMIT_S, stream=one)
    kit.rendezvous.launch(1, kit.flags, 1, 0, 11, LIMIT_S, stream=two)
    one.synchronize()
    two.synchronize()
    flags = kit.read_flags()
    cores = {flags[10] - 1, flags[11] - 1}
    assert len(cores) == 2, f"both kernels ran on core {cores}"
    assert all(0 <= core < npu.runtime().ai_cores for core in cores)


def test_higher_priority_ready_stream_is_served_first(npu, kit):
    """Both cores are held by gates; a priority-7 launch is queued before a priority-0 one.
    When exactly one core comes free, the priority-0 launch must take it."""
    cores = npu.runtime().ai_cores
    holders = [npu.Stream() for _ in range(cores)]
    for index, stream in enumerate(holders):
        kit.gate.launch(1, kit.flags, index, 20 + index, LIMIT_S, stream=stream)
    for index in range(cores):
        kit.wait_flag(index)  # every core is now busy
    log = kit.buffer(np.int32, 16)
    low, high = npu.Stream(priority=7), npu.Stream(priority=0)
    kit.log_id.launch(1, log, 7, stream=low)
    kit.log_id.launch(1, log, 0, stream=high)
    kit.set_flag(20)  # free one core only: one launch at a time can run
    high.synchronize()
    low.synchronize()
    for index in range(1, cores):
        kit.set_flag(20 + index)
    for stream in holders:
        stream.synchronize()
    entries = log.to_numpy(np.int32)
    assert list(entries[:3]) == [2, 0, 7], "the priority-7 launch ran before the priority-0 one"


# ---- events ----------------------------------------------------------------------------------


def test_event_wait_orders_two_streams(npu, kit):
    n = 4096
    producer, consumer = npu.Stream(), npu.Stream()
    data, seen = npu.DeviceBuffer(4 * n), kit.buffer(np.float32, n)
    data.fill(0)
    done = npu.Event()
    kit.slow_fill.launch(2, data, n, 42.0, 0.2, stream=producer)
    done.record(producer)
    consumer.wait_event(done)
    npu.runtime().memory.memcpy_async(
        seen.ptr,
        seen.nbytes,
        data.ptr,
        data.nbytes,
        codes.ACL_MEMCPY_DEVICE_TO_DEVICE,
        consumer.handle,
    )
    npu.builtin("add_f32").launch(2, seen, seen, seen, n, stream=consumer)
    consumer.synchronize()  # only the consumer: the event alone orders it after the producer
    np.testing.assert_array_equal(f32(seen), np.full(n, 84.0, np.float32))


def test_wait_binds_to_the_latest_record_at_the_time_of_the_wait(npu, kit):
    """record, wait, record again: the wait is satisfied by the first record. If it bound
    to the second one, the gate before the second record (released by the waiting
    stream) and the wait would deadlock and the gate would fail."""
    first, second = npu.Stream(), npu.Stream()
    event = npu.Event()
    event.record(first)
    second.wait_event(event)
    kit.gate.launch(1, kit.flags, 0, 1, LIMIT_S, stream=first)
    event.record(first)
    kit.signal.launch(1, kit.flags, 1, stream=second)
    second.synchronize()
    first.synchronize()
    event.synchronize()
    assert event.query()


def test_event_and_stream_status_timeouts_and_release(npu, kit):
    stream = npu.Stream()
    event = npu.Event()
    kit.gate.launch(1, kit.flags, 0, 1, LIMIT_S, stream=stream)
    event.record(stream)
    kit.wait_flag(0)
    rt = npu.runtime()
    assert (
        rt.sync.query_event_status(event.handle) == codes.ACL_EVENT_RECORDED_STATUS_NOT_READY == 0
    )
    assert rt.sync.stream_query(stream.handle) == codes.ACL_STREAM_STATUS_NOT_READY == 1
    for timeout in (0, 50):
        with pytest.raises(NpuError) as info:
            stream.synchronize(timeout)
        assert info.value.code == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT == 507046
        with pytest.raises(NpuError) as info:
            event.synchronize(timeout)
        assert info.value.code == codes.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT == 507047
        with pytest.raises(NpuError) as info:
            npu.runtime().sync.synchronize_device(timeout)
        assert info.value.code == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    kit.set_flag(1)
    event.synchronize()
    assert rt.sync.query_event_status(event.handle) == codes.ACL_EVENT_RECORDED_STATUS_COMPLETE == 1
    stream.synchronize(int(LIMIT_S * 1000))
    assert rt.sync.stream_query(stream.handle) == codes.ACL_STREAM_STATUS_COMPLETE == 0
    stream.synchronize(0)  # nothing pending: an immediate check succeeds
    event.synchronize(0)


def test_elapsed_time_covers_a_50_ms_kernel(npu, kit):
    stream = npu.Stream()
    start, end = npu.Event(), npu.Event()
    start.record(stream)
    kit.nap.launch(1, 0.05, stream=stream)
    end.record(stream)
    end.synchronize()
    assert start.elapsed_time(end) >= 50.0  # device clock; no upper bound asserted


def test_elapsed_time_errors(npu, kit):
    stream = npu.Stream()
    recorded, never, pending = npu.Event(), npu.Event(), npu.Event()
    recorded.record(stream)
    stream.synchronize()
    for first, second in ((recorded, never), (never, recorded)):
        with pytest.raises(NpuError) as info:
            first.elapsed_time(second)
        assert info.value.code == codes.ACL_ERROR_RT_INTERNAL_ERROR  # EVENT_RECORDER_NULL in CANN
    kit.gate.launch(1, kit.flags, 0, 1, LIMIT_S, stream=stream)
    pending.record(stream)
    with pytest.raises(NpuError) as info:
        recorded.elapsed_time(pending)
    assert info.value.code == codes.ACL_ERROR_RT_EVENT_NOT_COMPLETE
    kit.set_flag(1)
    stream.synchronize()
    assert recorded.elapsed_time(pending) >= 0.0


def test_reset_event(npu, kit):
    stream, other = npu.Stream(), npu.Stream()
    event = npu.Event()
    event.record(stream)
    event.synchronize()
    assert event.query()
    event.reset(stream)
    stream.synchronize()
    assert not event.query()
    # A wait on a reset event has no record to wait for: it does not block.
    other.wait_event(event)
    kit.signal.launch(1, kit.flags, 3, stream=other)
    other.synchronize(int(LIMIT_S * 1000))
    assert kit.read_flags()[3] == 1


# ---- destroying streams ------------------------------------------------------------------------


def test_destroy_stream_waits_for_its_tasks(npu, kit):
    n = 1000
    stream = npu.Stream()
    data = kit.buffer(np.float32, n)
    kit.slow_fill.launch(2, data, n, 5.0, 0.2, stream=stream)
    stream.destroy()
    # aclrtMemcpy is not stream-ordered: it sees the data only if destroy waited.
    np.testing.assert_array_equal(f32(data), np.full(n, 5.0, np.float32))


def test_destroy_stream_force_drops_queued_tasks(npu, kit):
    """The gate runs; behind it on the same stream a launch and an event record are queued.
    The gate is released by another stream that waits for that record, so only dropping
    the queued tasks (which fires their records) lets anything finish."""
    doomed, helper = npu.Stream(), npu.Stream()
    event = npu.Event()
    kit.gate.launch(1, kit.flags, 0, 1, LIMIT_S, stream=doomed)
    kit.signal.launch(1, kit.flags, 2, stream=doomed)  # must never run
    event.record(doomed)
    helper.wait_event(event)
    kit.signal.launch(1, kit.flags, 1, stream=helper)
    kit.wait_flag(0)
    doomed.destroy(force=True)
    helper.synchronize()
    flags = kit.read_flags()
    assert flags[1] == 1
    assert flags[2] == 0, "a task queued on a force-destroyed stream ran"
    # the gate was running: destroy waited for it, and it completed normally
    npu.runtime().sync.synchronize_device()


# ---- failure modes ------------------------------------------------------------------------------


def test_continue_on_failure_reports_once_and_keeps_going(npu, kit):
    n = 5
    stream = npu.Stream()
    marks, after = kit.buffer(np.int32, n, fill=0xFF), kit.buffer(np.float32, 16)
    site = call_site()
    kit.fail_in_block.launch(n, marks, n, 3, stream=stream)
    npu.builtin("fill_f32").launch(2, after, 7.0, 16, stream=stream)
    with pytest.raises(NpuError) as info:
        stream.synchronize()
    error = info.value
    assert error.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION == 507015
    assert "block 3/5" in error.message
    assert "Traceback" in error.message
    assert "ValueError: deliberate failure in block 3" in error.message
    assert "stream_kernels.py" in error.message  # the kernel's own frame
    assert site in error.message  # where the client launched it
    np.testing.assert_array_equal(f32(after), np.full(16, 7.0, np.float32))
    marks = marks.to_numpy(np.int32)
    assert marks[0] == 0 and marks[3] == -1  # block 0 ran; the failing block wrote nothing
    stream.synchronize()  # reported once
    npu.builtin("fill_f32").launch(1, after, 8.0, 16, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(f32(after), np.full(16, 8.0, np.float32))


def test_stop_on_failure_stops_every_stream_of_the_context(npu, kit):
    failing, other = npu.Stream(), npu.Stream()
    failing.set_failure_mode(codes.ACL_STOP_ON_FAILURE)
    out = kit.buffer(np.float32, 4)
    fill = npu.builtin("fill_f32")
    after_failure = npu.Event()
    kit.fail_in_block.launch(1, kit.flags, 1, 0, stream=failing)
    fill.launch(1, out, 1.0, 1, stream=failing)  # same stream, after the failure
    after_failure.record(failing)
    other.wait_event(after_failure)
    fill.launch(1, out, 2.0, 2, stream=other)  # other stream, after the failure
    for stream in (failing, other, failing, other):  # every later synchronize reports it
        with pytest.raises(NpuError) as info:
            stream.synchronize()
        assert info.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
        assert "deliberate failure in block 0" in info.value.message
    with pytest.raises(NpuError) as info:
        npu.runtime().sync.synchronize_device()
    assert info.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    fill.launch(1, out, 3.0, 4, stream=other)  # submitted after the failure
    with pytest.raises(NpuError):
        other.synchronize()
    with pytest.raises(NpuError):
        npu.Stream.wrap(0).synchronize()  # the default stream belongs to the context too
    assert list(f32(out)) == [0.0, 0.0, 0.0, 0.0], "a task ran after a STOP_ON_FAILURE failure"
    for stream in (failing, other):
        with pytest.raises(NpuError) as info:
            stream.set_failure_mode(codes.ACL_CONTINUE_ON_FAILURE)
        assert info.value.code == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT == 207000


def test_event_calls_succeed_over_an_earlier_failure_and_warn_once(npu, kit, capsys):
    """ACL_CONTINUE_ON_FAILURE: CANN's event synchronize/query report no task failure
    (Context::CheckStatus), so the codes stay 0; the client warns once, naming the task."""
    stream, event = npu.Stream(), npu.Event()
    site = call_site()
    kit.fail_in_block.launch(1, kit.flags, 1, 0, stream=stream)
    event.record(stream)
    event.synchronize()  # success, as on hardware
    warning = capsys.readouterr().err
    assert warning.count("simnpu: warning:") == 1, warning
    assert "aclrtSynchronizeEvent returned success" in warning
    assert site in warning  # the failed task's call site
    assert "507015" in warning and "deliberate failure in block 0" in warning
    assert f"aclrtSynchronizeStream of stream {stream.handle:#x}" in warning
    assert event.query()  # the same failure is not told twice
    event.synchronize()
    assert capsys.readouterr().err == ""
    with pytest.raises(NpuError) as info:  # still reported where ACL reports it
        stream.synchronize()
    assert info.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "deliberate failure in block 0" in info.value.message

    site = call_site()
    kit.fail_in_block.launch(1, kit.flags, 1, 0, stream=stream)
    event.record(stream)
    while not event.query():  # the query path warns too
        time.sleep(0.001)
    warning = capsys.readouterr().err
    assert "aclrtQueryEventStatus returned success" in warning and site in warning
    with pytest.raises(NpuError):
        stream.synchronize()

    event.record(stream)  # a failure after the record is not the event's business
    kit.fail_in_block.launch(1, kit.flags, 1, 0, stream=stream)
    event.synchronize()
    with pytest.raises(NpuError):
        stream.synchronize()
    event.synchronize()
    assert capsys.readouterr().err == ""
    event.destroy()
    stream.destroy()


def test_event_calls_report_a_stopped_context_failure(npu, kit, capsys):
    """ACL_STOP_ON_FAILURE: event synchronize and query report the context's failure."""
    stream, event = npu.Stream(), npu.Event()
    stream.set_failure_mode(codes.ACL_STOP_ON_FAILURE)
    kit.fail_in_block.launch(1, kit.flags, 1, 0, stream=stream)
    event.record(stream)
    for call in (event.synchronize, event.query, event.synchronize):
        with pytest.raises(NpuError) as info:
            call()
        assert info.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
        assert "deliberate failure in block 0" in info.value.message
    assert "warning" not in capsys.readouterr().err


def test_synchronize_device_waits_for_every_stream(npu, kit):
    n = 256
    streams = [npu.Stream() for _ in range(3)]
    buffers = [kit.buffer(np.float32, n) for _ in streams]
    for value, (stream, buffer) in enumerate(zip(streams, buffers), start=1):
        kit.slow_fill.launch(2, buffer, n, float(value), 0.1 * value, stream=stream)
    npu.runtime().sync.synchronize_device()
    for value, buffer in enumerate(buffers, start=1):
        np.testing.assert_array_equal(f32(buffer), np.full(n, value, np.float32))
    for stream in streams:
        assert stream.query()


def test_last_error_get_clears_peek_keeps(npu, kit):
    rt = npu.runtime()
    rt.devices.get_last_error()
    assert rt.devices.peek_at_last_error() == codes.ACL_SUCCESS
    stream = npu.Stream()
    kit.fail_in_block.launch(1, kit.flags, 1, 0, stream=stream)
    with pytest.raises(NpuError):
        stream.synchronize()
    assert rt.devices.peek_at_last_error() == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert rt.devices.peek_at_last_error() == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    seen_elsewhere = []
    thread = threading.Thread(target=lambda: seen_elsewhere.append(rt.devices.peek_at_last_error()))
    thread.start()
    thread.join()
    assert seen_elsewhere == [codes.ACL_SUCCESS]  # the slot is per thread
    assert rt.devices.get_last_error() == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert rt.devices.get_last_error() == codes.ACL_SUCCESS
    assert rt.devices.peek_at_last_error() == codes.ACL_SUCCESS
    stream.synchronize()  # the failure was reported once; success leaves the slot alone
    assert rt.devices.get_last_error() == codes.ACL_SUCCESS
