"""The scheduler on its own, on units that are threads of this process (thread_executor.py):
stream order, concurrency between streams, events, failure modes, priorities, clients in
turn, task aggregation, block chunks and operator timeouts -- no daemon, no socket, no
process."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest
from thread_executor import Memory, StandInDevice, ThreadExecutor

from simnpu.proto import codes
from simnpu.proto.kernel_abi import discover_kernels
from simnpu.server.core.executor import UnitKind
from simnpu.server.core.functions import Binary, Function
from simnpu.server.core.owner import Owner
from simnpu.server.core.scheduler import Scheduler
from simnpu.server.core.streams import Context, Event, Stream
from simnpu.server.core.tasks import (
    CopyTask,
    KernelTask,
    RecordTask,
    ResetTask,
    TaskState,
    WaitTask,
)
from simnpu.server.core.unit_protocol import RunKernel, Span
from simnpu.server.core.waiters import Waiter
from simnpu.shm.addresses import device_address

KERNELS = '''
import time
import numpy as np
from simnpu import kernel


@kernel()
def empty(ctx):
    pass


@kernel("ptr", "u64")
def bump(ctx, counter, pause_us):
    """counter += 1, slowly: two at once would lose an update."""
    cell = ctx.gm(counter, "int64", 1)
    value = int(cell[0])
    time.sleep(pause_us / 1e6)
    cell[0] = value + 1


@kernel("ptr", "i64")
def store(ctx, cell, value):
    ctx.gm(cell, "int64", 1)[0] = value


@kernel("ptr", "ptr")
def copy_cell(ctx, src, dst):
    ctx.gm(dst, "int64", 1)[0] = ctx.gm(src, "int64", 1, access="r")[0]


@kernel("ptr", "ptr")
def meet(ctx, mine, theirs):
    """Raise my flag, then wait (at most 5 s) for theirs: returns only if both run at once."""
    ctx.gm(mine, "int64", 1)[0] = 1
    other = ctx.gm(theirs, "int64", 1, access="r")
    deadline = time.monotonic() + 5
    while other[0] == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the other kernel never ran at the same time")
        time.sleep(0.001)


@kernel("ptr")
def wait_for(ctx, flag):
    """Hold the core until the flag is set (at most 5 s)."""
    view = ctx.gm(flag, "int64", 1, access="r")
    deadline = time.monotonic() + 5
    while view[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)


@kernel("u64")
def sleep_ms(ctx, milliseconds):
    time.sleep(milliseconds / 1000)


@kernel()
def fail(ctx):
    raise ValueError("this kernel fails")
'''


class EightBytesEach:
    """The test's argument resolver: each pointer argument may touch the 8-byte cell it
    points to (the daemon's is a client's memory, server/memory/launch_arguments.py)."""

    def resolve(self, function: Function, values: tuple) -> tuple[tuple, tuple]:
        types = function.signature.types
        return values, tuple((value, 8) for kind, value in zip(types, values) if kind == "ptr")

    def read(self, address: int, size: int) -> bytes:
        raise AssertionError("the tests' launches carry their arguments")


class Rig:
    """A scheduler over one device of `ai_cores` thread units, a client and its streams."""

    def __init__(self, ai_cores: int = 2, copy_engines: int = 2, op_timeout_s: float = 30.0):
        self.memory = Memory()
        self.device = StandInDevice(0, ai_cores, copy_engines, 0)
        self.executor = ThreadExecutor(self.device.all_units(), self.memory)
        self.executor.start(self.executor.units)
        self.scheduler = Scheduler([self.device], self.executor, op_timeout_s)
        self.scheduler.start()
        self.announced: list[int] = []
        self.owner = Owner(1, self.announced.append)
        self.context = Context(1, 0, self.owner)
        self.owner.contexts.append(self.context)
        self.binary = Binary(2, KERNELS, "<test kernels>", discover_kernels(KERNELS))
        self.functions: dict[str, Function] = {}  # one aclrtBinaryGetFunction per kernel
        self.seq = 0
        self.streams = 0
        self.cells = 0
        self.clients = 1

    def close(self) -> None:
        self.scheduler.stop()
        self.executor.stop()

    def stream(self, priority: int = 0, context: Context | None = None) -> Stream:
        self.streams += 1
        context = context or self.context
        stream = Stream(self.streams, context, priority)
        context.streams.append(stream)
        return stream

    def client(self) -> Context:
        """The context of another client of the device (an Owner of its own)."""
        self.clients += 1
        owner = Owner(self.clients, self.announced.append)
        context = Context(owner.id, 0, owner)
        owner.contexts.append(context)
        return context

    def cell(self, value: int = 0) -> int:
        """The device address of a fresh int64 holding `value`."""
        offset = 64 * self.cells
        self.cells += 1
        np.frombuffer(self.memory.maps[0], np.int64, 1, offset)[0] = value
        return device_address(0, offset)

    def read(self, address: int) -> int:
        return int(
            np.frombuffer(self.memory.maps[0], np.int64, 1, address - device_address(0, 0))[0]
        )

    def kernel(self, stream: Stream, name: str, *args, blocks: int = 1) -> KernelTask:
        function = self.functions.get(name)
        if function is None:
            function = Function(self.binary, name, self.binary.kernels[name])
            self.functions[name] = function
        self.seq += 1
        return self.submit(
            KernelTask(
                self.seq,
                stream,
                function,
                blocks,
                tuple(args),
                EightBytesEach(),
            )
        )

    def submit(self, task):
        self.scheduler.post([(self.scheduler.submit, (task,))])
        return task

    def task(self, cls, stream, *args):
        self.seq += 1
        return self.submit(cls(self.seq, stream, *args))

    def until(self, condition, timeout_s: float = 20.0) -> None:
        """Wait until `condition()` holds under the scheduler lock."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.scheduler.lock:
                if condition():
                    return
            assert time.monotonic() < deadline, "the scheduler did not get there"
            time.sleep(0.002)

    def drain(self, *streams: Stream) -> None:
        self.until(lambda: all(not s.tasks for s in streams))


@pytest.fixture
def rig():
    made = Rig()
    yield made
    made.close()


# ---- streams ----------------------------------------------------------------------------------
def test_a_stream_runs_its_tasks_one_after_the_other(rig):
    stream = rig.stream()
    counter = rig.cell()
    tasks = [rig.kernel(stream, "bump", counter, 2000) for _ in range(20)]
    rig.drain(stream)
    assert rig.read(counter) == 20  # two at once would have lost updates (2 cores are free)
    assert all(t.state == TaskState.DONE and t.failure is None for t in tasks)
    ends = [t.timestamp for t in tasks]
    assert ends == sorted(ends)


def test_different_streams_run_at_once(rig):
    first, second = rig.stream(), rig.stream()
    a, b = rig.cell(), rig.cell()
    one = rig.kernel(first, "meet", a, b)
    two = rig.kernel(second, "meet", b, a)
    rig.drain(first, second)
    assert one.failure is None and two.failure is None


# ---- events -----------------------------------------------------------------------------------
def test_a_wait_holds_its_stream_until_the_record_before_it_has_run(rig):
    producer, consumer = rig.stream(), rig.stream()
    flag, source, target = rig.cell(), rig.cell(), rig.cell()
    event = Event(1, rig.context, 0)
    rig.kernel(producer, "wait_for", flag)  # the record cannot run before the flag is set
    rig.kernel(producer, "store", source, 42)
    record = rig.task(RecordTask, producer, event)
    wait = rig.task(WaitTask, consumer, event)
    rig.kernel(consumer, "copy_cell", source, target)
    time.sleep(0.05)
    with rig.scheduler.lock:
        assert wait.state == TaskState.PENDING and consumer.tasks[0] is wait  # held
    np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
    rig.drain(producer, consumer)
    assert wait.record is record and rig.read(target) == 42
    assert consumer.clock >= record.timestamp  # its clock moved to the record's time


def test_a_wait_binds_to_the_latest_record_and_a_reset_event_is_not_waited_for(rig):
    first, second = rig.stream(), rig.stream()
    event = Event(1, rig.context, 0)
    never_waited = rig.task(WaitTask, second, event)  # no record yet: passes
    rig.drain(second)
    assert never_waited.record is None and never_waited.state == TaskState.DONE
    early = rig.task(RecordTask, first, event)
    late = rig.task(RecordTask, first, event)
    wait = rig.task(WaitTask, second, event)
    rig.drain(first, second)
    assert wait.record is late and early is not late
    rig.task(ResetTask, first, event)
    rig.drain(first)
    assert event.latest_record is None


# ---- failures ---------------------------------------------------------------------------------
def test_continue_on_failure_keeps_the_first_failure_and_runs_on(rig):
    stream = rig.stream()
    cell = rig.cell()
    failing = rig.kernel(stream, "fail")
    rig.kernel(stream, "fail")
    after = rig.kernel(stream, "store", cell, 7)
    rig.drain(stream)
    assert failing.failure.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "this kernel fails" in failing.failure.message
    assert stream.failure is failing.failure  # reported once at the next synchronize
    assert after.failure is None and rig.read(cell) == 7


def test_stop_on_failure_drops_what_every_stream_of_the_context_has_queued(rig):
    first, second = rig.stream(), rig.stream()
    rig.context.failure_mode = codes.ACL_STOP_ON_FAILURE
    flag, cell, other = rig.cell(), rig.cell(), rig.cell()
    rig.kernel(second, "wait_for", flag)  # keeps `second` busy while `first` fails
    rig.kernel(second, "store", other, 5)
    failing = rig.kernel(first, "fail")
    never = rig.kernel(first, "store", cell, 1)
    rig.until(lambda: rig.context.failure is not None)
    np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
    rig.drain(first, second)
    assert rig.context.failure is failing.failure
    assert never.state == TaskState.DONE and rig.read(cell) == 0  # dropped, never ran
    assert rig.read(other) == 0  # the other stream's queued launch was dropped too
    late = rig.kernel(first, "store", cell, 2)  # after the stop nothing more runs
    rig.drain(first)
    assert late.state == TaskState.DONE and rig.read(cell) == 0


# ---- priorities, aggregation, chunks --------------------------------------------------------
def test_the_higher_priority_stream_is_served_first():
    rig = Rig(ai_cores=1)
    try:
        blocker, low, high = rig.stream(), rig.stream(priority=7), rig.stream(priority=0)
        flag = rig.cell()
        rig.kernel(blocker, "wait_for", flag)  # the only core is busy
        rig.until(lambda: blocker.tasks[0].state == TaskState.DISPATCHED)
        slow = rig.kernel(low, "empty")
        urgent = rig.kernel(high, "empty")
        np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
        rig.drain(blocker, low, high)
        assert urgent.timestamp < slow.timestamp
    finally:
        rig.close()


# ---- clients in turn ------------------------------------------------------------------------
def served(rig: Rig) -> list[int]:
    """The arguments of the `sleep_ms` kernels the AI cores got, in order: the tests below
    name a kernel's client (or its place) by it."""
    return [
        RunKernel.unpack(item).args[0]
        for _, batch in rig.executor.batches
        for item in batch
        if item[0] == RunKernel.TAG and RunKernel.unpack(item).name == "sleep_ms"
    ]


def test_a_free_ai_core_serves_the_clients_in_turn_whatever_their_streams():
    """Client 2 has three streams of two kernels queued, client 3 one stream of three:
    once the core frees, they alternate -- client 3 first, since client 2 had the core
    last -- until client 3 has nothing left; each client's streams in their order."""
    rig = Rig(ai_cores=1)
    try:
        many, one = rig.client(), rig.client()
        blocker_stream = rig.stream(context=many)
        flag = rig.cell()
        blocker = rig.kernel(blocker_stream, "wait_for", flag)
        rig.until(lambda: blocker.state == TaskState.DISPATCHED)
        streams = [rig.stream(context=many) for _ in range(3)]
        for stream in streams:  # 2 ms each: over the run budget, one kernel per batch
            rig.kernel(stream, "sleep_ms", 2)
            rig.kernel(stream, "sleep_ms", 2)
        lone = rig.stream(context=one)
        for _ in range(3):
            rig.kernel(lone, "sleep_ms", 3)
        np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
        rig.drain(blocker_stream, lone, *streams)
        assert served(rig) == [3, 2, 3, 2, 3, 2, 2, 2, 2]
    finally:
        rig.close()


def test_stream_priorities_order_a_clients_own_streams_only():
    """A client's high-priority stream goes before its other streams, not before the
    turn of another client."""
    rig = Rig(ai_cores=1)
    try:
        first, second = rig.client(), rig.client()
        blocker_stream = rig.stream(context=second)
        flag = rig.cell()
        blocker = rig.kernel(blocker_stream, "wait_for", flag)
        rig.until(lambda: blocker.state == TaskState.DISPATCHED)
        low = rig.stream(priority=7, context=first)
        rig.kernel(low, "sleep_ms", 1)
        urgent = rig.stream(priority=0, context=second)
        rig.kernel(urgent, "sleep_ms", 2)
        also_low = rig.stream(priority=7, context=second)
        rig.kernel(also_low, "sleep_ms", 3)
        np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
        rig.drain(blocker_stream, low, urgent, also_low)
        assert served(rig) == [1, 2, 3]  # first's turn, then second's urgent
    finally:
        rig.close()


def kernels_per_batch(rig: Rig) -> list[int]:
    return [sum(item[0] == RunKernel.TAG for item in batch) for _, batch in rig.executor.batches]


def test_single_block_launches_of_a_stream_go_to_one_core_in_one_batch():
    rig = Rig(ai_cores=1)
    try:
        stream = rig.stream()
        flag = rig.cell()
        rig.kernel(stream, "empty")  # it has run once: its launches' time is known
        rig.drain(stream)
        rig.executor.batches.clear()
        rig.kernel(stream, "wait_for", flag)  # the rest queue up behind it
        rig.until(lambda: stream.tasks[0].state == TaskState.DISPATCHED)
        for _ in range(10):
            rig.kernel(stream, "empty")
        np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
        rig.drain(stream)
        assert kernels_per_batch(rig) == [1, 10]
    finally:
        rig.close()


def test_a_run_holds_a_core_for_about_a_millisecond_of_kernels():
    """Kernels never seen to run, and kernels that took more than the budget, go one at a
    time; tiny ones as many as fit in it (tests/server/test_policy.py: run_budget)."""
    rig = Rig(ai_cores=1)
    try:
        stream = rig.stream()
        flag = rig.cell()
        rig.kernel(stream, "wait_for", flag)
        rig.until(lambda: stream.tasks[0].state == TaskState.DISPATCHED)
        for _ in range(4):
            rig.kernel(stream, "sleep_ms", 2)  # never ran yet, then 2 ms: over the budget
        np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
        rig.drain(stream)
        assert kernels_per_batch(rig) == [1, 1, 1, 1, 1]
        assert rig.functions["sleep_ms"].ran_ns >= 2_000_000
    finally:
        rig.close()


def test_a_launch_of_many_blocks_is_shared_out_in_chunks_over_the_cores(rig):
    stream = rig.stream()
    task = rig.kernel(stream, "empty", blocks=64)
    rig.drain(stream)
    chunks = [
        (launch.first, launch.last)
        for _, batch in rig.executor.batches
        for item in batch
        if item[0] == RunKernel.TAG
        for launch in [RunKernel.unpack(item)]
    ]
    assert task.failure is None and len(chunks) > 1
    assert sorted(chunks)[0][0] == 0 and sum(last - first for first, last in chunks) == 64
    assert len({unit.core_id for unit, _ in rig.executor.batches}) == 2  # both cores took some


def test_dropping_what_is_queued_lets_a_launch_handed_out_in_part_finish(rig):
    """Force destroy, STOP mode: the rest of a launch already running is not dropped."""
    stream = rig.stream()
    flag = rig.cell()
    task = rig.kernel(stream, "wait_for", flag, blocks=4)  # blocks 0-1, 2 on the cores; 3 waits
    queued = rig.kernel(stream, "empty")
    rig.until(lambda: task.handed == 3)
    rig.scheduler.call(rig.scheduler.drop_pending, stream)
    np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
    rig.drain(stream)
    assert task.handed == 4 and task.failure is None
    assert queued.state == TaskState.DONE


def test_the_launch_of_a_session_that_ended_stops_taking_blocks(rig):
    """Its blocks not handed out are dropped, and its cores skip those they have not
    started: 10,000 blocks of 5 ms (25 s per core) end after a block or so."""
    stream = rig.stream()
    task = rig.kernel(stream, "sleep_ms", 5, blocks=10_000)
    rig.until(lambda: task.state == TaskState.DISPATCHED)
    rig.owner.closed = True
    rig.scheduler.call(rig.scheduler.drop_pending, stream)
    rig.drain(stream)
    assert task.state == TaskState.DONE and task.handed < 10_000
    assert not any(unit.inflight for unit in rig.device.units[UnitKind.AI_CORE])


def test_a_copy_runs_on_a_copy_engine(rig):
    stream = rig.stream()
    source, target = rig.cell(99), rig.cell()
    base = device_address(0, 0)
    rig.task(CopyTask, stream, Span("dev0", target - base, 0), Span("dev0", source - base, 0), 8)
    rig.drain(stream)
    assert rig.read(target) == 99
    ((unit, _),) = rig.executor.batches
    assert unit.kind is UnitKind.COPY_ENGINE


# ---- waiting and timeouts ---------------------------------------------------------------------
def test_a_waiter_is_settled_when_its_stream_gets_there_or_at_its_deadline(rig):
    stream = rig.stream()
    settled: list[bool] = []
    scheduler = rig.scheduler
    task = rig.kernel(stream, "sleep_ms", 50)
    waiter = Waiter(lambda: not stream.tasks, settled.append)
    scheduler.call(lambda: scheduler.watch(waiter, streams=[stream]))
    rig.until(lambda: settled == [False])  # settled, not timed out
    assert task.state == TaskState.DONE
    rig.kernel(stream, "sleep_ms", 2000)
    late = Waiter(lambda: not stream.tasks, settled.append, time.monotonic() + 0.1)
    scheduler.call(lambda: scheduler.watch(late, streams=[stream]))
    rig.until(lambda: settled == [False, True], timeout_s=5)  # timed out; the task still runs
    assert stream.tasks


def test_waiters_settled_before_their_deadline_are_not_kept(rig):
    """A synchronize with a long timeout that returns early leaves nothing of its caller
    among the scheduler's timers (they would keep its whole session alive)."""

    class Caller:  # what a synchronize's answer holds: its session
        pass

    stream = rig.stream()
    scheduler = rig.scheduler
    callers = []
    for _ in range(200):
        caller = Caller()
        callers.append(weakref.ref(caller))
        rig.kernel(stream, "sleep_ms", 5)  # still running when the waiter is watched
        waiter = Waiter(
            lambda: not stream.tasks,
            lambda timed_out, caller=caller: None,
            time.monotonic() + 3600,
        )
        scheduler.call(lambda waiter=waiter: scheduler.watch(waiter, streams=[stream]))
        rig.drain(stream)
        del caller, waiter
    gc.collect()
    assert not [ref for ref in callers if ref() is not None]
    assert len(scheduler._timers) < 100  # the settled ones were shed, not kept


def test_a_kernel_past_the_operator_timeout_fails_and_its_core_is_replaced():
    rig = Rig(ai_cores=1, op_timeout_s=0.2)
    try:
        stream = rig.stream()
        core = rig.device.units[UnitKind.AI_CORE][0]
        slow = rig.kernel(stream, "sleep_ms", 1500)
        after = rig.kernel(stream, "empty")
        rig.drain(stream)
        assert slow.failure.code == codes.ACL_ERROR_RT_AICORE_TIMEOUT
        assert "exceeded the operator execution timeout" in slow.failure.message
        assert after.failure is None  # the replacement core ran the next one
        assert core.generation == 1 and core.restarts == 1
    finally:
        rig.close()


def test_the_units_take_run_kernel_and_write_signal_items_field_by_field():
    """The worker calls run_kernel(*fields) and write_signal(*fields): their parameters are
    the items' fields, in order (server/core/unit_protocol.py)."""
    import inspect

    from simnpu.server.core.unit_protocol import WriteSignal
    from simnpu.server.units.runner import WorkRunner

    for method, item in (
        (WorkRunner.run_kernel, RunKernel),
        (WorkRunner.write_signal, WriteSignal),
    ):
        assert list(inspect.signature(method).parameters)[1:] == list(item._fields), method


# ---- aclrtStreamAbort / aclrtStreamStop ---------------------------------------------------------
def test_an_abort_ends_the_running_launch_and_discards_the_queue(rig):
    stream = rig.stream()
    flag, cell = rig.cell(), rig.cell()
    event = Event(1, rig.context, 0)
    running = rig.kernel(stream, "wait_for", flag, blocks=4)  # 2 blocks out, 2 not handed
    queued = rig.kernel(stream, "store", cell, 5)
    record = rig.task(RecordTask, stream, event)
    rig.until(lambda: running.handed == 3)
    rig.scheduler.call(rig.scheduler.abort, stream, False)
    rig.drain(stream)
    assert running.state == queued.state == record.state == TaskState.DONE
    assert running.handed == 3 and rig.read(cell) == 0
    assert stream.failure is not None and stream.failure.code == codes.ACL_ERROR_RT_STREAM_ABORT
    assert stream.failure.seq == running.seq
    assert sum(unit.restarts for unit in rig.device.units[UnitKind.AI_CORE]) == 2
    stream.failure = None
    again = rig.kernel(stream, "store", cell, 6)  # the stream works as before
    rig.drain(stream)
    assert again.failure is None and rig.read(cell) == 6


def test_a_stop_ends_the_running_launch_and_requeues_the_run_behind_it():
    rig = Rig(ai_cores=1)
    try:
        stream = rig.stream()
        flag, cell = rig.cell(), rig.cell()
        running = rig.kernel(stream, "wait_for", flag)
        rig.until(lambda: running.state == TaskState.DISPATCHED)
        behind = [rig.kernel(stream, "store", cell, value) for value in (1, 2)]
        rig.scheduler.call(rig.scheduler.abort, stream, True)
        rig.drain(stream)
        assert all(task.failure is None for task in behind)
        assert rig.read(cell) == 2  # both ran, in order, after the stop
        assert stream.failure is not None and stream.failure.seq == running.seq
        assert rig.device.units[UnitKind.AI_CORE][0].restarts == 1
    finally:
        rig.close()


def test_stopping_an_idle_stream_reports_nothing(rig):
    stream = rig.stream()
    rig.scheduler.call(rig.scheduler.abort, stream, True)
    rig.scheduler.call(rig.scheduler.abort, stream, False)
    assert stream.failure is None


# ---- stream resource limits ---------------------------------------------------------------------
def test_a_streams_core_limit_wins_over_its_owners():
    rig = Rig(ai_cores=4)
    try:
        limited, other = rig.stream(), rig.stream()
        rig.owner.res_limits[0] = {codes.ACL_RT_DEV_RES_CUBE_CORE: 1}
        rig.owner.core_limits[0] = 1
        limited.res_limits[codes.ACL_RT_DEV_RES_CUBE_CORE] = 3
        assert limited.limits(4) == (3, 4) and limited.core_limit(4) == 3
        assert other.limits(4) == (1, 4) and other.core_limit(4) == 1
        rig.kernel(limited, "sleep_ms", 20, blocks=12)
        rig.drain(limited)
        assert {unit.core_id for unit, _ in rig.executor.batches} <= {0, 1, 2}
        rig.executor.batches.clear()
        rig.kernel(other, "sleep_ms", 20, blocks=12)
        rig.drain(other)
        assert {unit.core_id for unit, _ in rig.executor.batches} == {0}
    finally:
        rig.close()


def test_a_quiet_client_is_let_in_once_its_running_work_ends_and_nothing_of_it_starts():
    """Scheduler.quiet (an export copying its pages into a file of their own): it is
    entered only once the client's running kernel has ended; while inside, none of the
    client's work starts -- neither device work on a free core nor a stream's next task
    -- and another client's work runs; on leaving, the client's work goes on."""
    rig = Rig()
    try:
        mine, flag, seen, later = rig.stream(), rig.cell(), rig.cell(), rig.cell()
        blocker = rig.kernel(mine, "wait_for", flag)
        rig.kernel(mine, "store", later, 5)  # behind the blocker, on its stream
        rig.until(lambda: blocker.state == TaskState.DISPATCHED)
        inside, leave = threading.Event(), threading.Event()
        seen_inside: list[tuple[TaskState, int, int]] = []

        def export() -> None:
            with rig.scheduler.quiet(rig.owner):
                seen_inside.append((blocker.state, rig.read(seen), rig.read(later)))
                inside.set()
                leave.wait(20)

        exporting = threading.Thread(target=export)
        exporting.start()
        rig.until(lambda: rig.scheduler.holds(blocker))
        held = rig.kernel(rig.stream(), "store", seen, 1)  # a free core, but it waits
        other = rig.stream(context=rig.client())
        theirs = rig.cell()
        rig.kernel(other, "store", theirs, 7)
        rig.drain(other)
        assert rig.read(theirs) == 7, "another client's work waited too"
        assert held.state == TaskState.PENDING and rig.read(seen) == 0
        assert not inside.is_set(), "let in while the client's kernel was running"
        np.frombuffer(rig.memory.maps[0], np.int64, 1, flag - device_address(0, 0))[0] = 1
        assert inside.wait(20)
        assert seen_inside == [(TaskState.DONE, 0, 0)]
        rig.drain(other)
        assert held.state == TaskState.PENDING and rig.read(later) == 0, "work started inside"
        leave.set()
        exporting.join(20)
        assert not exporting.is_alive()
        rig.drain(mine, held.stream)
        assert rig.read(seen) == 1 and rig.read(later) == 5
        assert not rig.scheduler.holds(held)
    finally:
        rig.close()
