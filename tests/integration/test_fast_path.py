"""The shared-memory fast path against a real daemon (docs/fast-path.md): calls through the
submission ring, replies through the mailbox, synchronize decided on the stream word, and
every case where the daemon must still be asked or must end the session."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import FAIL, GATE, runtime_of

from simnpu.client.runtime import Runtime
from simnpu.proto import codes, commands
from simnpu.proto import observe as observe_bits
from simnpu.proto.errors import NpuError
from simnpu.server.control.session_fast_path import STREAM_ITEM_WAIT_S
from simnpu.shm import futex

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="futexes are not available here")

H2D = codes.ACL_MEMCPY_HOST_TO_DEVICE
D2H = codes.ACL_MEMCPY_DEVICE_TO_HOST

KERNELS = (
    GATE
    + FAIL
    + '''


@kernel("ptr", "u32")
def count_up(ctx, cell, unused):
    """cell[0] += 1."""
    ctx.gm(cell, "int64", 1)[0] += 1
'''
)


@pytest.fixture
def rt(daemon):
    with runtime_of(daemon.address) as runtime:
        yield runtime


class Kernels:
    def __init__(self, rt):
        self.rt = rt
        binary = rt.kernels.binary_load(KERNELS, "notify_kernels.py")
        self.functions = {
            name: rt.kernels.get_function(binary, name) for name in ("gate", "fail", "count_up")
        }
        self.empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")

    def launch(self, name, stream, *args, blocks=1):
        function = self.empty if name == "empty" else self.functions[name]
        self.rt.kernels.launch_kernel(
            function, blocks, self.rt.kernels.signature(function).pack(*args), stream
        )


@pytest.fixture
def kernels(rt):
    return Kernels(rt)


def write_int(rt, address: int, value: int, dtype=np.int32) -> None:
    cell = np.array([value], dtype)
    rt.memory.memcpy(address, cell.nbytes, cell.ctypes.data, cell.nbytes, H2D)


def read_int(rt, address: int, dtype=np.int64) -> int:
    cell = np.zeros(1, dtype)
    rt.memory.memcpy(cell.ctypes.data, cell.nbytes, address, cell.nbytes, D2H)
    return int(cell[0])


def test_a_client_sharing_dev_shm_uses_the_notify_area(rt):
    assert rt.connection.mailbox is not None
    assert rt.fast_path is not None
    before = rt.connection.mailbox.replies
    pointers = [rt.memory.malloc(4096) for _ in range(5)]
    assert len(set(pointers)) == 5
    assert rt.connection.mailbox.replies == before + 5
    for pointer in pointers:
        rt.memory.free(pointer)


@pytest.mark.parametrize("flags", [0, codes.ACL_STREAM_FAST_SYNC], ids=["plain", "fast_sync"])
def test_a_synchronize_is_decided_on_the_stream_word_and_ordered(rt, kernels, flags):
    """On a stream created with ACL_STREAM_FAST_SYNC too (its waits poll longer)."""
    stream = rt.streams.create_stream(flags=flags)
    assert rt.contexts.streams[stream].fast_sync == bool(flags)
    cell = rt.memory.malloc(8)
    write_int(rt, cell, 0, np.int64)
    before = rt.sync.decided
    for round_ in range(1, 51):
        kernels.launch("count_up", stream, cell, 0)
        rt.sync.synchronize_stream(stream)
        assert read_int(rt, cell) == round_  # the kernel really ran before synchronize returned
    assert rt.sync.decided == before + 50
    rt.memory.free(cell)
    rt.streams.destroy_stream(stream)
    assert stream not in rt.contexts.streams  # its record, and its fast sync, are gone


def test_the_default_stream_has_a_word_too(rt, kernels):
    before = rt.sync.decided
    kernels.launch("empty", 0)
    rt.sync.synchronize_stream(0)
    assert rt.sync.decided == before + 1


def test_a_failing_kernel_is_reported_then_the_stream_is_clean_again(rt, kernels):
    stream = rt.streams.create_stream()
    kernels.launch("fail", stream, 10)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(stream)
    assert raised.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "RuntimeError: xxxxxxxxxx" in raised.value.message
    rt.sync.synchronize_stream(stream)  # reported once: nothing left to report
    before = rt.sync.decided
    kernels.launch("empty", stream)
    rt.sync.synchronize_stream(stream)
    assert rt.sync.decided == before + 1
    rt.streams.destroy_stream(stream)


def test_a_failure_message_too_big_for_a_mailbox_slot_comes_whole(rt, kernels):
    stream = rt.streams.create_stream()
    kernels.launch("fail", stream, 20000)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(stream)
    assert "RuntimeError: " + "x" * 20000 in raised.value.message
    rt.streams.destroy_stream(stream)


def test_a_call_the_daemon_rejects_wakes_the_synchronize_and_is_reported(rt):
    stream = rt.streams.create_stream()
    bogus_function = (5 << 40) | 999_999
    rt.connection.send_command(commands.Launch.pack(1, stream, bogus_function, b""), "test", stream)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(stream, timeout_ms=20_000)
    assert raised.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    rt.sync.synchronize_stream(stream)
    rt.streams.destroy_stream(stream)


def closed_gate(rt, kernels, stream) -> int:
    """Hold `stream` with the gate kernel until write_int(rt, flag, 1); returns the flag."""
    flag = rt.memory.malloc(4)
    write_int(rt, flag, 0)
    kernels.launch("gate", stream, flag, 30.0)
    return flag


def test_a_rejected_call_behind_running_work_waits_for_that_work(rt, kernels):
    stream = rt.streams.create_stream()
    flag = closed_gate(rt, kernels, stream)
    rt.connection.send_command(
        commands.Launch.pack(1, stream, (5 << 40) | 999_999, b""), "test", stream
    )
    opening = threading.Event()  # set just before the gate opens
    threading.Timer(0.3, lambda: (opening.set(), write_int(rt, flag, 1))).start()
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(stream)
    assert raised.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert opening.is_set()  # it waited for the gate, not only for the word
    rt.memory.free(flag)
    rt.streams.destroy_stream(stream)


def test_a_timed_synchronize_times_out_on_the_word_and_the_daemon_says_so(rt, kernels):
    stream = rt.streams.create_stream()
    flag = closed_gate(rt, kernels, stream)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(stream, timeout_ms=100)
    assert raised.value.code == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    write_int(rt, flag, 1)
    rt.sync.synchronize_stream(stream, timeout_ms=20_000)
    rt.memory.free(flag)
    rt.streams.destroy_stream(stream)


def test_a_timed_synchronize_of_a_fast_sync_stream_times_out_while_it_polls(rt, kernels):
    """5 ms is inside the 20 ms a fast-sync synchronize polls: the deadline ends the poll."""
    stream = rt.streams.create_stream(flags=codes.ACL_STREAM_FAST_SYNC)
    flag = closed_gate(rt, kernels, stream)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(stream, timeout_ms=5)
    assert raised.value.code == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    threading.Timer(0.05, write_int, (rt, flag, 1)).start()
    rt.sync.synchronize_stream(stream, timeout_ms=20_000)  # polls, then sleeps until the gate opens
    rt.memory.free(flag)
    rt.streams.destroy_stream(stream)


def test_stop_on_failure_reports_the_context_failure_on_another_stream(rt, kernels):
    context = rt.contexts.create_context(0)
    first, second = rt.streams.create_stream(), rt.streams.create_stream()
    rt.streams.set_stream_failure_mode(first, codes.ACL_STOP_ON_FAILURE)
    kernels_here = Kernels(rt)
    kernels_here.launch("fail", first, 5)
    with pytest.raises(NpuError):
        rt.sync.synchronize_stream(first)
    kernels_here.launch("empty", second)
    with pytest.raises(NpuError) as raised:
        rt.sync.synchronize_stream(second)
    assert raised.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    rt.contexts.destroy_context(context)
    rt.contexts.set_device(0)


def in_threads(rt, count: int, work) -> None:
    """Run `work()` in `count` threads at once, each with device 0 set; fail on any error."""
    errors = []

    def body():
        try:
            rt.contexts.set_device(0)
            work()
            rt.contexts.reset_device(0)
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=body) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors


def test_threads_synchronizing_their_own_streams_at_once(rt, kernels):
    def work():
        stream = rt.streams.create_stream()
        cell = rt.memory.malloc(8)
        write_int(rt, cell, 0, np.int64)
        for round_ in range(1, 31):
            kernels.launch("count_up", stream, cell, 0)
            rt.sync.synchronize_stream(stream)
            assert read_int(rt, cell) == round_
        rt.memory.free(cell)
        rt.streams.destroy_stream(stream)

    in_threads(rt, 4, work)


def test_more_requests_in_flight_than_mailbox_slots(rt):
    results = []

    def work():
        for _ in range(20):
            results.append(rt.memory.malloc(64))

    in_threads(rt, 24, work)
    assert len(set(results)) == 24 * 20
    for pointer in results:
        rt.memory.free(pointer)


def test_an_observed_session_asks_the_daemon(rt, kernels):
    rt.observer.enable(observe_bits.TRACE)
    before = rt.sync.decided
    kernels.launch("empty", 0)
    rt.sync.synchronize_stream(0)
    assert rt.sync.decided == before


def test_a_client_without_shared_memory_has_no_notify_area(daemon, monkeypatch):
    monkeypatch.setenv("SIMNPU_NO_SHM", "1")
    runtime = Runtime(daemon.address)
    try:
        assert runtime.connection.mailbox is None and runtime.fast_path is None
        runtime.contexts.set_device(0)
        empty = runtime.kernels.get_function(commands.BUILTIN_BINARY, "empty")
        runtime.kernels.launch_kernel(empty, 1, b"", 0)
        runtime.sync.synchronize_stream(0)
        assert runtime.memory.malloc(64)
    finally:
        runtime.close()


def test_a_sleeping_synchronize_sees_the_daemon_die(start_daemon):
    daemon = start_daemon()
    runtime = Runtime(daemon.address)
    try:
        runtime.contexts.set_device(0)
        kernels = Kernels(runtime)
        flag = runtime.memory.malloc(4)
        write_int(runtime, flag, 0)
        kernels.launch("gate", 0, flag, 3.0)  # the core notices the dead daemon after it
        threading.Timer(0.3, daemon.process.send_signal, (signal.SIGKILL,)).start()
        start = time.monotonic()
        with pytest.raises(NpuError) as raised:
            runtime.sync.synchronize_stream(0)
        assert raised.value.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
        assert time.monotonic() - start < 30
    finally:
        runtime.close()
        daemon.process.wait(30)


# ---- the submission ring ------------------------------------------------------------------
def test_calls_go_through_the_submission_ring(rt, kernels):
    ring = rt.connection.ring
    assert ring is not None
    before = ring.written
    kernels.launch("empty", 0)
    assert ring.written == before + commands.Launch.LAYOUT.size
    rt.sync.synchronize_stream(0)


def test_a_request_too_big_for_the_ring_keeps_its_place_in_the_order(rt, kernels):
    from simnpu.shm.ring import MAX_RECORD

    stream = rt.streams.create_stream()
    cell = rt.memory.malloc(8)
    write_int(rt, cell, 0, np.int64)
    big_source = KERNELS + "\n# " + "padding " * (MAX_RECORD // 8) + "\n"
    kernels.launch("count_up", stream, cell, 0)
    before = rt.connection.ring.written
    binary = rt.kernels.binary_load(
        big_source, "big_module.py"
    )  # by the stream, marked in the ring
    assert rt.connection.ring.written - before < 64
    count_up = rt.kernels.get_function(binary, "count_up")
    rt.kernels.launch_kernel(count_up, 1, rt.kernels.signature(count_up).pack(cell, 0), stream)
    rt.sync.synchronize_stream(stream)
    assert read_int(rt, cell) == 2
    rt.memory.free(cell)
    rt.streams.destroy_stream(stream)


def corrupt_head(victim: Runtime) -> None:
    victim.fast_path.ring_region.map[0:8] = (1 << 62).to_bytes(
        8, "little"
    )  # a head no writer can have
    victim.connection.ring.wake_consumer()


def garbage_record(victim: Runtime) -> None:
    victim.connection.ring.put(b"\xff\xff" + bytes(64))


def marker_without_item(victim: Runtime) -> None:
    """The ring marks a request as gone by the stream, which never sends it."""
    victim.connection.ring.put(commands.RingStreamItem.RECORD)


@pytest.mark.parametrize(
    "corrupt, what",
    [
        (corrupt_head, "bytes apart"),
        (garbage_record, "unknown command op 65535"),
        pytest.param(marker_without_item, "did not arrive", marks=pytest.mark.slow),
    ],
)
def test_a_corrupt_ring_ends_only_that_session(daemon, rt, corrupt, what):
    from conftest import round_trip

    victim = Runtime(daemon.address)
    try:
        victim.contexts.set_device(0)
        corrupt(victim)
        # The victim writes nothing more: its next put would publish a sane head over a
        # corrupt one. Its background reader sees the daemon end the session.
        deadline = time.monotonic() + 30 + STREAM_ITEM_WAIT_S
        while victim.connection.broken is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert victim.connection.broken is not None
        with pytest.raises(NpuError) as refused:  # and every later call reports it
            victim.memory.malloc(64)
        assert refused.value.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
        assert victim.connection.broken.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
        assert "submission ring is corrupt" in victim.connection.broken.message
        assert what in victim.connection.broken.message
    finally:
        victim.close()
    round_trip(rt)  # everybody else goes on


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children (a daemon and its workers)."""
    from conftest import children_of

    total = 0
    for process in [pid, *children_of(pid)]:
        with open(f"/proc/{process}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_an_idle_daemon_with_a_fast_path_client_burns_no_cpu(daemon, rt):
    assert rt.connection.ring is not None
    rt.sync.synchronize_device()
    before = cpu_seconds(daemon.pid)
    time.sleep(3.0)  # the ring thread and the scheduler nap; nothing polls
    assert cpu_seconds(daemon.pid) - before < 0.15  # busy polling would burn ~3 s of CPU here
