"""Event synchronize and query, stream query and device synchronize decided on the streams'
completion signals (docs/fast-path.md), against a real daemon: the answer without a request
when the signal proves it, the request (and exactly its codes and messages) otherwise."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time

import numpy as np
import pytest
from conftest import FAIL, GATE, DaemonProcess, round_trip, runtime_of

from simnpu.client.runtime import Runtime
from simnpu.proto import codes, commands
from simnpu.proto import observe as observe_bits
from simnpu.proto.errors import NpuError
from simnpu.shm import futex

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="futexes are not available here")

COMPLETE = codes.ACL_EVENT_RECORDED_STATUS_COMPLETE
NOT_READY = codes.ACL_EVENT_RECORDED_STATUS_NOT_READY
STREAM_COMPLETE = codes.ACL_STREAM_STATUS_COMPLETE
STREAM_NOT_READY = codes.ACL_STREAM_STATUS_NOT_READY

KERNELS = (
    GATE
    + FAIL
    + """


@kernel("u32")
def talk(ctx, tag):
    ctx.printf("tag %u talks\\n", tag)
"""
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A daemon of two devices shared by the tests of this module."""
    process = DaemonProcess(tmp_path_factory.mktemp("npu"), "--devices", "2")
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture
def rt(daemon):
    with runtime_of(daemon.address) as runtime:
        yield runtime


class Work:
    """Kernels of a runtime: empty, gate (held until opened), fail."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        binary = rt.kernels.binary_load(KERNELS, "signal_kernels.py")
        self.gate_kernel = rt.kernels.get_function(binary, "gate")
        self.fail_kernel = rt.kernels.get_function(binary, "fail")
        self.talk_kernel = rt.kernels.get_function(binary, "talk")
        self.empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")

    def launch(self, function: int, stream: int, *args) -> None:
        self.rt.kernels.launch_kernel(
            function, 1, self.rt.kernels.signature(function).pack(*args), stream
        )

    def gate(self, stream: int) -> int:
        """Hold `stream` until open(flag) (the gate fails after 30 s); returns the flag."""
        flag = self.rt.memory.malloc(4)
        write_flag(self.rt, flag, 0)
        self.launch(self.gate_kernel, stream, flag, 30.0)
        return flag

    def open(self, flag: int) -> None:
        write_flag(self.rt, flag, 1)


def write_flag(rt: Runtime, address: int, value: int) -> None:
    cell = np.array([value], np.int32)
    rt.memory.memcpy(address, 4, cell.ctypes.data, 4, codes.ACL_MEMCPY_HOST_TO_DEVICE)


@pytest.fixture
def work(rt):
    return Work(rt)


@contextlib.contextmanager
def no_request(rt: Runtime, decided: int = 1):
    """The block sends nothing to the daemon (no call takes a sequence number) and
    `decided` calls are answered on the signals."""
    seq, before = rt.connection.log.seq, rt.sync.decided
    yield
    assert rt.connection.log.seq == seq
    assert rt.sync.decided == before + decided


@contextlib.contextmanager
def requests(rt: Runtime, count: int = 1):
    """The block asks the daemon `count` times and decides nothing on the signals."""
    seq, before = rt.connection.log.seq, rt.sync.decided
    yield
    assert rt.connection.log.seq == seq + count
    assert rt.sync.decided == before


def outcome(call, *args) -> tuple[int, str] | int | None:
    """What `call` returned, or (code, message) of what it raised."""
    try:
        return call(*args)
    except NpuError as error:
        return error.code, error.message


# ---- completed work: no request ------------------------------------------------------------
def test_completed_work_is_answered_without_a_request(rt, work):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    work.launch(work.empty, stream)
    rt.events.record_event(event, stream)
    with no_request(rt):
        rt.sync.synchronize_event(event)
    with no_request(rt):
        assert rt.sync.query_event_status(event) == COMPLETE
    with no_request(rt):
        assert rt.sync.stream_query(stream) == STREAM_COMPLETE
    with no_request(rt):
        rt.sync.synchronize_device()
    work.launch(work.empty, stream)
    with no_request(rt):
        rt.sync.synchronize_device()
    with no_request(rt):
        assert rt.sync.stream_query(stream) == STREAM_COMPLETE
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


def test_the_acl_calls_take_the_signal_path(daemon, acl):
    from simnpu.client.device import runtime

    rt = runtime()
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")
    rt.kernels.launch_kernel(empty, 1, b"", stream)
    assert acl.rt.record_event(event, stream) == 0
    with no_request(rt, decided=4):
        assert acl.rt.synchronize_event_with_timeout(event, 5000) == 0
        assert acl.rt.query_event_status(event) == (COMPLETE, 0)
        assert acl.rt.stream_query(stream) == (STREAM_COMPLETE, 0)
        assert acl.rt.synchronize_device_with_timeout(5000) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


# ---- pending work --------------------------------------------------------------------------
def test_pending_work_asks_and_a_synchronize_sleeps_on_the_signal(rt, work):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    flag = work.gate(stream)
    rt.events.record_event(event, stream)
    with requests(rt):
        assert rt.sync.query_event_status(event) == NOT_READY  # the signal cannot say "not yet"
    with requests(rt):
        assert rt.sync.stream_query(stream) == STREAM_NOT_READY
    opened = threading.Event()
    threading.Timer(0.3, lambda: (opened.set(), work.open(flag))).start()
    before = rt.sync.decided
    rt.sync.synchronize_event(event)  # woken by the signal, not asking
    assert opened.is_set()
    assert rt.sync.decided == before + 1
    with no_request(rt):
        assert rt.sync.query_event_status(event) == COMPLETE
    rt.memory.free(flag)
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


def test_an_event_whose_record_is_not_its_streams_last_call_asks(rt, work):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    first = work.gate(stream)
    rt.events.record_event(event, stream)
    second = work.gate(stream)  # the signal is written when the stream drains: after this
    with requests(rt):
        assert rt.sync.query_event_status(event) == NOT_READY
    threading.Timer(0.2, work.open, (first,)).start()
    before = rt.sync.decided
    rt.sync.synchronize_event(event)  # the daemon answers once the record ran
    assert rt.sync.decided == before
    with requests(rt):
        assert rt.sync.query_event_status(event) == COMPLETE
    with requests(rt):
        assert rt.sync.stream_query(stream) == STREAM_NOT_READY
    work.open(second)
    rt.sync.synchronize_stream(stream)
    with no_request(rt):  # drained: now the signal proves it
        assert rt.sync.query_event_status(event) == COMPLETE
    for flag in (first, second):
        rt.memory.free(flag)
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


def test_a_launch_behind_a_waited_record_hands_the_wait_to_the_daemon(rt, work):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    first = work.gate(stream)
    rt.events.record_event(event, stream)
    before = rt.sync.decided
    waited = threading.Thread(target=rt.sync.synchronize_event, args=(event,))
    waited.start()  # sleeps on the signal: the record is the stream's last call
    second = work.gate(stream)  # now it is not: the signal will not stop at the record
    work.open(first)
    waited.join(30)  # the daemon answered when the record ran, with the stream still held
    assert not waited.is_alive()
    assert rt.sync.decided == before
    with requests(rt):
        assert rt.sync.stream_query(stream) == STREAM_NOT_READY
    work.open(second)
    rt.sync.synchronize_stream(stream)
    for flag in (first, second):
        rt.memory.free(flag)
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


def test_timeouts_end_on_the_daemons_answer(rt, work):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    flag = work.gate(stream)
    rt.events.record_event(event, stream)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_event(event, timeout_ms=50)
    assert raised.value.code == codes.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
    assert raised.value.message == "event synchronize timed out"
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_device(timeout_ms=50)
    assert raised.value.code == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    assert raised.value.message == "synchronize timed out"
    work.open(flag)
    rt.sync.synchronize_event(event, timeout_ms=20_000)
    with no_request(rt):
        rt.sync.synchronize_device(timeout_ms=20_000)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_device(timeout_ms=-2)  # refused by the daemon, as before
    assert raised.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    rt.memory.free(flag)
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


# ---- several streams, events recorded twice, another device --------------------------------
def test_device_synchronize_waits_for_every_stream(rt, work):
    streams = [rt.streams.create_stream() for _ in range(3)]
    flag = work.gate(streams[1])
    for stream in streams:
        work.launch(work.empty, stream)
    opened = threading.Event()
    threading.Timer(0.3, lambda: (opened.set(), work.open(flag))).start()
    before = rt.sync.decided
    rt.sync.synchronize_device()
    assert opened.is_set()
    assert rt.sync.decided == before + 1
    with no_request(rt):  # the stream of the last call
        assert rt.sync.stream_query(streams[-1]) == STREAM_COMPLETE
    with requests(rt):
        assert rt.sync.stream_query(streams[0]) == STREAM_COMPLETE
    rt.memory.free(flag)
    for stream in streams:
        rt.streams.destroy_stream(stream)


def test_a_query_of_a_stream_that_is_not_the_last_one_used_asks(rt, work):
    first, second = rt.streams.create_stream(), rt.streams.create_stream()
    work.launch(work.empty, first)
    work.launch(work.empty, second)
    rt.sync.synchronize_device()
    with requests(rt):  # a later call (on another stream) could yet be rejected
        assert rt.sync.stream_query(first) == STREAM_COMPLETE
    with no_request(rt):
        assert rt.sync.stream_query(second) == STREAM_COMPLETE
    for stream in (first, second):
        rt.streams.destroy_stream(stream)


def test_an_event_recorded_twice_follows_its_latest_record(rt, work):
    first, second = rt.streams.create_stream(), rt.streams.create_stream()
    event = rt.events.create_event()
    work.launch(work.empty, first)
    rt.events.record_event(event, first)
    rt.sync.synchronize_stream(first)
    with no_request(rt):
        assert rt.sync.query_event_status(event) == COMPLETE
    flag = work.gate(second)
    rt.events.record_event(event, second)
    with requests(rt):
        assert rt.sync.query_event_status(event) == NOT_READY
    work.open(flag)
    rt.sync.synchronize_event(event)
    with no_request(rt):
        assert rt.sync.query_event_status(event) == COMPLETE
    rt.memory.free(flag)
    rt.events.destroy_event(event)
    for stream in (first, second):
        rt.streams.destroy_stream(stream)


def test_an_event_recorded_on_a_stream_of_another_device(rt, work):
    event = rt.events.create_event()  # of device 0
    rt.contexts.set_device(1)
    other = rt.streams.create_stream()
    empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")
    rt.kernels.launch_kernel(empty, 1, b"", other)
    rt.contexts.set_device(0)
    rt.events.record_event(event, other)
    with no_request(rt):
        rt.sync.synchronize_event(event)
    with no_request(rt):
        assert rt.sync.query_event_status(event) == COMPLETE
    with no_request(rt):
        rt.sync.synchronize_device()  # device 0 has nothing left; the last call is covered
    rt.contexts.set_device(1)
    with no_request(rt):
        rt.sync.synchronize_device()
    rt.streams.destroy_stream(other)
    rt.contexts.reset_device(1)
    rt.events.destroy_event(event)


# ---- failures: reported exactly as by the request --------------------------------------------
def failing_scenario(rt: Runtime, work: Work) -> list:
    """A failing kernel, then event, stream and device calls: what each returned or raised."""
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    work.launch(work.fail_kernel, stream, 12)
    rt.events.record_event(event, stream)
    results = [
        outcome(rt.sync.synchronize_event, event),  # succeeds, warns
        outcome(rt.sync.query_event_status, event),
        outcome(rt.sync.stream_query, stream),  # reports the failure
        outcome(rt.sync.stream_query, stream),
    ]
    work.launch(work.fail_kernel, stream, 7)
    results += [outcome(rt.sync.synchronize_device), outcome(rt.sync.synchronize_device)]
    work.launch(work.fail_kernel, stream, 3)
    rt.events.record_event(event, stream)
    results += [
        outcome(rt.sync.synchronize_event, event),
        outcome(rt.sync.query_event_status, event),
        outcome(rt.sync.synchronize_stream, stream),
    ]
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)
    return results


def test_failures_are_reported_as_the_request_reports_them(rt, work, capfd, monkeypatch):
    on_signals = failing_scenario(rt, work)
    warned = capfd.readouterr().err
    with monkeypatch.context() as patch:
        patch.setattr(
            rt.sync, "_deciding", lambda *contexts, **_: None
        )  # every call asks the daemon
        by_request = failing_scenario(rt, work)
    assert on_signals == by_request
    numbers = re.compile(r"task \d+ |0x[0-9a-f]+")  # of other calls, of another stream
    assert numbers.sub("", capfd.readouterr().err) == numbers.sub("", warned)
    assert on_signals[0] is None and on_signals[1] == COMPLETE
    assert on_signals[2][0] == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "RuntimeError: xxxxxxxxxxxx" in on_signals[2][1]
    assert on_signals[3] == STREAM_COMPLETE
    assert on_signals[4][0] == codes.ACL_ERROR_RT_AICORE_EXCEPTION and on_signals[5] is None
    assert on_signals[6] is None and on_signals[7] == COMPLETE
    assert on_signals[8][0] == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert warned.count("simnpu: warning: aclrtSynchronizeEvent returned success") == 2
    assert "aclrtQueryEventStatus returned success" not in warned  # each is told once


def test_a_rejected_call_is_reported_by_the_query_and_device_synchronize(rt):
    stream = rt.streams.create_stream()
    bogus = commands.Launch.pack(1, stream, (5 << 40) | 999_999, b"")
    rt.connection.send_command(bogus, "test", stream)
    with pytest.raises(NpuError) as raised:
        rt.sync.stream_query(stream)
    assert raised.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    rt.connection.send_command(bogus, "test", stream)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_device()
    assert raised.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    rt.streams.destroy_stream(stream)


def test_stop_on_failure_asks_the_daemon(rt, work):
    context = rt.contexts.create_context(0)
    first, second = rt.streams.create_stream(), rt.streams.create_stream()
    event = rt.events.create_event()
    work.launch(work.empty, second)
    rt.events.record_event(event, second)
    rt.sync.synchronize_stream(second)
    rt.streams.set_stream_failure_mode(first, codes.ACL_STOP_ON_FAILURE)
    failing = Work(rt)
    failing.launch(failing.fail_kernel, first, 4)
    with pytest.raises(NpuError):
        rt.sync.synchronize_stream(first)
    for call, args in (
        (rt.sync.query_event_status, (event,)),  # the stopped context's failure, every time
        (rt.sync.synchronize_event, (event,)),
        (rt.sync.stream_query, (second,)),
        (rt.sync.synchronize_device, ()),
    ):
        with pytest.raises(NpuError) as raised:
            call(*args)
        assert raised.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    rt.contexts.destroy_context(context)
    rt.contexts.set_device(0)


def test_stop_on_failure_reaches_a_stream_synchronized_clean_before(rt, work):
    context = rt.contexts.create_context(0)
    clean, failing = rt.streams.create_stream(), rt.streams.create_stream()
    rt.streams.set_stream_failure_mode(clean, codes.ACL_STOP_ON_FAILURE)
    failing_work = Work(rt)
    flag = failing_work.gate(failing)
    failing_work.launch(failing_work.fail_kernel, failing, 4)
    work.launch(work.empty, clean)  # the latest call: its signal would prove it
    rt.sync.synchronize_stream(clean)
    failing_work.open(flag)  # (a copy: nothing whose failure is reported later)
    with pytest.raises(NpuError) as first:
        rt.sync.synchronize_stream(failing)
    assert first.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    for timeout_ms in (-1, 5000):  # the stopped context's failure, as the daemon answers
        with requests(rt), pytest.raises(NpuError) as raised:
            rt.sync.synchronize_stream(clean, timeout_ms)
        assert (raised.value.code, raised.value.message) == (first.value.code, first.value.message)
    rt.contexts.destroy_context(context)
    rt.contexts.set_device(0)
    round_trip(rt)


def test_output_of_another_streams_kernel_comes_with_the_next_synchronize(rt, work, capfd):
    quiet, talking = rt.streams.create_stream(), rt.streams.create_stream()
    flag = work.gate(talking)
    work.launch(work.talk_kernel, talking, 7)
    work.launch(work.empty, quiet)  # the latest call: its signal would prove it
    rt.sync.synchronize_stream(quiet)
    assert "talks" not in capfd.readouterr().out
    work.open(flag)
    while rt.sync.stream_query(talking) != STREAM_COMPLETE:  # a query prints nothing
        time.sleep(0.005)
    assert "talks" not in capfd.readouterr().out
    rt.sync.synchronize_stream(quiet)  # what this process's kernels printed, as docs/acl.md says
    assert capfd.readouterr().out.count("tag 7 talks") == 1
    work.launch(work.empty, quiet)
    with no_request(rt):  # taken: the signals decide again
        rt.sync.synchronize_stream(quiet)
    assert "talks" not in capfd.readouterr().out
    for stream in (quiet, talking):
        rt.streams.destroy_stream(stream)


# ---- what the signals never decide ------------------------------------------------------------
def test_events_the_signals_do_not_decide_ask(rt, work):
    stream = rt.streams.create_stream()
    plain, external = rt.events.create_event(), rt.events.create_event(codes.ACL_EVENT_EXTERNAL)
    ipc = rt.events.create_event(codes.ACL_EVENT_IPC)
    work.launch(work.empty, stream)
    for event in (plain, external, ipc):
        rt.events.record_event(event, stream)
    rt.events.reset_event(plain, stream)
    rt.sync.synchronize_stream(stream)
    for event in (plain, external, ipc):
        with requests(rt):
            rt.sync.synchronize_event(event)
        with requests(rt):
            rt.sync.query_event_status(event)
    for event in (plain, external, ipc):
        rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


def test_an_observed_session_asks_the_daemon(rt, work):
    event = rt.events.create_event()
    work.launch(work.empty, 0)
    rt.events.record_event(event, 0)
    rt.sync.synchronize_stream(0)
    rt.observer.enable(observe_bits.TRACE)
    for call, args in (
        (rt.sync.synchronize_event, (event,)),
        (rt.sync.query_event_status, (event,)),
        (rt.sync.stream_query, (0,)),
        (rt.sync.synchronize_device, ()),
    ):
        with requests(rt):
            call(*args)
    rt.events.destroy_event(event)


def test_a_capture_and_a_model_hand_the_calls_to_the_daemon(rt, work):
    stream, capturing = rt.streams.create_stream(), rt.streams.create_stream()
    event = rt.events.create_event()
    work.launch(work.empty, capturing)
    rt.events.record_event(event, stream)
    rt.sync.synchronize_device()
    rt.graphs.capture_begin(capturing, codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    with pytest.raises(NpuError) as raised:  # refused while a stream is captured, as before
        rt.sync.stream_query(capturing)
    assert raised.value.code == codes.ACL_ERROR_RT_STREAM_CAPTURED
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_device()
    assert raised.value.code == codes.ACL_ERROR_RT_STREAM_CAPTURED
    rt.events.record_event(event, capturing)
    model = rt.graphs.capture_end(capturing)
    with requests(rt):  # replays record events the call log does not show
        assert rt.sync.query_event_status(event) == COMPLETE
    with requests(rt):
        rt.sync.synchronize_device()
    rt.graphs.model_destroy(model)
    rt.events.destroy_event(event)
    for handle in (stream, capturing):
        rt.streams.destroy_stream(handle)


def test_a_stream_synchronize_during_its_capture_is_refused(rt, work):
    origin, pulled = rt.streams.create_stream(), rt.streams.create_stream()
    event = rt.events.create_event()
    work.launch(work.empty, pulled)
    rt.sync.synchronize_stream(pulled)
    work.launch(work.empty, origin)  # the latest call: its signal would prove it
    rt.sync.synchronize_stream(origin)
    rt.graphs.capture_begin(origin, codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    calls = (
        (rt.sync.synchronize_stream, (origin,)),
        (rt.sync.synchronize_stream, (origin, 5000)),
        (rt.sync.stream_query, (origin,)),
    )
    for call, args in calls:
        with requests(rt), pytest.raises(NpuError) as raised:
            call(*args)
        assert raised.value.code == codes.ACL_ERROR_RT_STREAM_CAPTURED
    rt.events.record_event(event, origin)
    rt.events.stream_wait_event(pulled, event)  # pulled into the capture
    rt.events.record_event(event, pulled)
    for stream in (origin, pulled):
        with requests(rt), pytest.raises(NpuError) as raised:
            rt.sync.synchronize_stream(stream)
        assert raised.value.code == codes.ACL_ERROR_RT_STREAM_CAPTURED
    rt.events.stream_wait_event(origin, event)  # joined back
    status, _ = rt.graphs.capture_get_info(origin)
    assert status == codes.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE  # the refusals left it valid
    model = rt.graphs.capture_end(origin)
    for stream in (origin, pulled):
        rt.sync.synchronize_stream(stream)
    rt.graphs.model_execute_async(model, origin)
    rt.sync.synchronize_stream(origin)
    with no_request(rt):  # a replay is its stream's command: the signal proves it
        rt.sync.synchronize_stream(origin)
    rt.graphs.model_destroy(model)
    rt.events.destroy_event(event)
    for stream in (origin, pulled):
        rt.streams.destroy_stream(stream)


def test_bad_handles_are_refused_as_before(rt, daemon):
    event = rt.events.create_event()
    rt.events.destroy_event(event)
    for call, args in (
        (rt.sync.synchronize_event, (event,)),
        (rt.sync.query_event_status, (event,)),
        (rt.sync.stream_query, (0xDEAD,)),
    ):
        with pytest.raises(NpuError) as raised:
            call(*args)
        assert raised.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    with runtime_of(daemon.address) as other:
        round_trip(other)


# ---- the daemon dies while a call waits on a signal ---------------------------------------------
def test_waits_on_signals_see_the_daemon_die(start_daemon):
    daemon = start_daemon()
    runtime = Runtime(daemon.address)
    try:
        runtime.contexts.set_device(0)
        work = Work(runtime)
        event = runtime.events.create_event()
        work.gate(0)  # never opened: the core notices the dead daemon after 30 s at most
        runtime.events.record_event(event, 0)
        raised: dict[str, NpuError] = {}

        def wait(name, call):
            runtime.contexts.set_device(0)
            try:
                call()
            except NpuError as error:
                raised[name] = error

        threads = [
            threading.Thread(
                target=wait, args=("event", lambda: runtime.sync.synchronize_event(event))
            ),
            threading.Thread(target=wait, args=("device", runtime.sync.synchronize_device)),
        ]
        for thread in threads:
            thread.start()
        daemon.process.send_signal(signal.SIGKILL)
        for thread in threads:
            thread.join(30)
        assert set(raised) == {"event", "device"}
        broken = runtime.connection.broken
        assert broken is not None and broken.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
        for error in raised.values():
            assert (error.code, error.message) == (broken.code, broken.message)
        with pytest.raises(NpuError) as queried:
            runtime.sync.stream_query(0)
        assert queried.value.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
    finally:
        runtime.close()
        daemon.process.wait(30)
