"""The scheduler: every stream queue, event and unit of the daemon, behind one lock.

Sessions post batches of (function, args); `post` runs them in order under the lock on the
session's own thread, then hands out whatever became ready, so a launch reaches its unit
without waking another thread. The scheduler thread sleeps in `Executor.wait` until a unit
reports (or a deadline comes) and takes the reports under the same lock.

Per stream, tasks run strictly in order: only the head task is ever on a unit (except a run
of single-block launches handed to one core at once, which that core also runs in order).
Control tasks (event record/wait/reset, host callbacks, collectives) run in the scheduler
when they reach the head; device work (server/core/tasks/) is queued as ready and handed to
free units of its kind, higher-priority streams first -- for an AI core, first among the
streams of the client whose turn it is: the clients get the free cores in turn, whatever
their number of streams (`pick_client`; docs/architecture.md, "Fair AI cores"). Blocked
host calls are `Waiter`s re-checked as tasks complete, with deadlines. The scheduler knows
units only through the `Executor` protocol (server/core/executor.py) and its owners only
through `Owner` and the streams' completion signals (simnpu.shm.notify.StreamSignal): when
a stream drains it publishes the signal, and when a unit gets the whole tail of a stream it
may lend it the signal to write (`_lend`, the one place that decides who writes it).
Features reach it through the core's interfaces only: a stream's recorder takes its tasks
(recorder.py), the dispatcher's ready work goes out first (dispatcher.py), subscribers see
the work (subscriber.py).

Why one module: everything here is the state behind one lock -- the stream queues, the
ready lists, the units' books, the waiters and timers -- and every method reads or changes
it under that lock; its small pure policies (`pick_stream`, `pick_client`, the core-limit
checks) stay beside the loop that calls them on every launch, where a module of their own
would be one more on every launch's path (bench/launch_path.py).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from simnpu.proto import codes
from simnpu.server.core.core_shares import SHARE_WINDOW_S, CoreShare, core_share
from simnpu.server.core.dispatcher import IDLE, Dispatcher
from simnpu.server.core.executor import LOST, Executor, Unit, UnitKind
from simnpu.server.core.owner import Owner
from simnpu.server.core.streams import Failure, Stream
from simnpu.server.core.tasks import DeviceWork, KernelTask, Task, TaskState
from simnpu.server.core.unit_protocol import Accesses, Ready, WriteSignal
from simnpu.server.core.waiters import Waiter

if TYPE_CHECKING:
    from simnpu.server.core.device import Device
    from simnpu.server.core.subscriber import Subscriber

log = logging.getLogger("simnpu.scheduler")

# The longest the scheduler thread sleeps. A deadline further away than this needs no
# wake-up when it is set (the thread sees it at its next turn), so handing a unit its
# work -- whose deadline is the operator timeout away, 300 s by default -- costs no
# wake-up of this thread; an idle daemon wakes once per NAP_S, which costs nothing.
NAP_S = 1.0
TIMERS_KEPT = 64  # settled waiters stay among the timers until this many, or twice the live ones


class Scheduler:
    def __init__(
        self,
        devices: Sequence[Device],
        executor: Executor,
        op_timeout_s: float,
        core_share_window_s: float = SHARE_WINDOW_S,
    ):
        self.devices = devices
        self.executor = executor
        self.op_timeout_s = op_timeout_s
        self.core_share_window_s = core_share_window_s  # (server/core/core_shares.py)
        self._share_lapses: float | None = None  # when a client stops counting for a share
        self.lock = threading.RLock()  # held while any scheduler state is read or changed
        self._sleep_until = 0.0  # when the scheduler thread's wait returns by itself
        self._timers: list = []
        self._timers_limit = TIMERS_KEPT  # the timers are rid of settled waiters at this length
        self._timer_ids = itertools.count()
        self._dirty: deque[Stream] = deque()  # streams whose head must be looked at again
        self._at_completions: list[Stream] = []  # streams whose head waits on a device word
        self._tokens = itertools.count(1)
        self._turns = itertools.count(1)  # AI-core hand-outs, numbered (Owner.core_turns)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="simnpu-scheduler", daemon=True)
        # work handed out before the streams' (server/core/dispatcher.py): the daemon's is
        # HCCL's matched collectives (server/hccl/collectives.py)
        self.dispatcher: Dispatcher = IDLE
        # who sees the work (server/core/subscriber.py): empty, every hook costs nothing
        self.subscribers: tuple[Subscriber, ...] = ()
        self._started_ns = time.monotonic_ns()
        # clients waiting for a moment when no unit runs their work (quiet); the clients
        # held, none of whose work starts meanwhile, with how many wait or are inside; and
        # their streams that stopped advancing
        self._quiet: list[_Quiet] = []
        self._held: dict[Owner, int] = {}
        self._parked: list[Stream] = []

    # ---- any thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def post(self, batch: list[tuple[Callable, tuple]]) -> None:
        """Run each (function, args) of `batch` in order under the scheduler lock, then hand
        out the work that became ready. Runs on the caller's thread; returns when done."""
        with self.lock:
            for function, args in batch:
                try:
                    function(*args)
                except Exception:
                    log.exception(
                        "scheduler operation %s failed", getattr(function, "__name__", function)
                    )
            self._pump()

    def call(self, function: Callable, *args: Any) -> None:
        self.post([(function, args)])

    @contextlib.contextmanager
    def quiet(self, owner: Owner) -> Iterator[None]:
        """While inside, no unit runs work of `owner` and none of its work starts: its
        device work is not handed out and its streams do not advance (an export copies the
        pages it shares into a file of their own: server/memory/device_memory.py, `share`).
        Entering blocks until no unit runs its work -- at most until its running work ends,
        or its operator timeout. Other clients' work goes on."""
        waiting = _Quiet(owner)
        with self.lock:
            if self._stopping:
                raise RuntimeError("the daemon is stopping")
            self._quiet.append(waiting)
            self._held[owner] = self._held.get(owner, 0) + 1
            self._settle_quiet()
        try:
            waiting.done.wait()
            if waiting.error is not None:
                raise waiting.error
            yield
        finally:
            with self.lock:
                if waiting in self._quiet:
                    self._quiet.remove(waiting)
                left = self._held.pop(owner, 1) - 1
                if left:
                    self._held[owner] = left
                else:  # its streams go on from where they stopped
                    parked = [stream for stream in self._parked if stream.owner is owner]
                    self._parked = [stream for stream in self._parked if stream.owner is not owner]
                    self._dirty.extend(parked)
                self._pump()

    def holds(self, work: Task | Any) -> bool:
        """Whether `work` (a task, or a dispatcher's job) waits for a `quiet` client: it
        touches the memory of one (under the lock)."""
        return bool(self._held) and any(owner in self._held for owner in work.owners)

    def subscribe(self, subscriber: Subscriber) -> None:
        """`subscriber` sees the work from now on (under the lock)."""
        self.subscribers = (*self.subscribers, subscriber)

    def note_deadline(self, deadline: float) -> None:
        """Someone set a deadline (under the lock): wake the thread if it sleeps past it."""
        if deadline < self._sleep_until:
            self.executor.wake()

    def stop(self) -> None:
        self._stopping = True
        self.executor.wake()
        self._thread.join(10)
        with self.lock:  # nobody will let them in now
            for waiting in self._quiet:
                waiting.error = RuntimeError("the daemon is stopping")
                waiting.done.set()

    def utilisation(self, device: Device) -> float:
        """Fraction of the device's AI-core time spent executing since the daemon started.
        Reads counters without the lock (a monitoring figure)."""
        cores = device.units[UnitKind.AI_CORE]
        busy = sum(unit.busy_ns for unit in cores)
        elapsed = (time.monotonic_ns() - self._started_ns) * max(len(cores), 1)
        return busy / elapsed if elapsed > 0 else 0.0

    # ---- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._step()
            except Exception:  # a bug must not stop the device: log it and go on
                log.exception("scheduler step failed")

    def _step(self) -> None:
        with self.lock:
            timeout = self._next_timeout()
            self._sleep_until = time.monotonic() + timeout
        reports = self.executor.wait(timeout)
        with self.lock:
            self._sleep_until = 0.0  # awake: nobody needs to wake this thread
            for unit, generation, report in reports:
                if generation == unit.generation:  # (else it came from a unit since replaced)
                    self._on_report(unit, report)
            if self._quiet:
                self._settle_quiet()
            self._pump()
            self._expire()

    def _pump(self) -> None:
        while True:
            while self._dirty:
                self._advance(self._dirty.popleft())
            self._dispatch()
            if not self._dirty:
                return

    # ---- stream progress --------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        """Queue a task at the tail of its stream, unless the stream's recorder takes it
        (server/core/recorder.py)."""
        stream = task.stream
        recorder = stream.recorder
        if recorder is not None:
            taken = recorder.take(task, self)
            if taken is None:
                return
            task = taken
        task.submitted()
        pulled = stream.recorder
        if pulled is not recorder and pulled is not None:  # a wait for a recorded task pulled
            pulled.take(task, self, submitted=True)  # its stream in: that recorder takes it
            return
        self.queue(task)

    def queue(self, task: Task) -> None:
        """Queue a task whose `submitted()` has run at the tail of its stream (`submit`'s
        second half; a replay's tasks, server/graphs/replay_task.py)."""
        stream = task.stream
        for subscriber in self.subscribers:
            subscriber.submitted(task)
        if stream.context.failure is not None:  # stopped on failure: nothing more runs
            self.discard(task)
            if not stream.tasks:
                drained(stream, task.seq)
            return
        if not stream.tasks:
            stream.clock = max(stream.clock, time.monotonic_ns())
            self._dirty.append(stream)
        stream.tasks.append(task)

    def _advance(self, stream: Stream) -> None:
        """Start the tasks at the head of `stream` until one waits."""
        if self._held and stream.owner in self._held:  # kept quiet: it goes on after
            self._parked.append(stream)
            return
        tasks = stream.tasks
        while tasks:
            task = tasks[0]
            if task.state != TaskState.PENDING or not task.start(self):
                return
            self.complete(task)

    def complete(self, task: Task) -> None:
        """`task` (its stream's head) is done: its stream goes on."""
        if task.probe:  # followed (a traced-only device task has False: nothing to do here)
            for subscriber in self.subscribers:
                subscriber.completing(task)
        task.state = TaskState.DONE
        stream = task.stream
        head = stream.tasks.popleft()
        assert head is task, "tasks complete in stream order"
        if task.moves_clock:
            stream.clock = max(stream.clock, task.timestamp)
        if task.failure is not None:
            self._fail(stream, task.failure)
        if task.waiters:
            self._release(task)
        if stream.watchers:
            self._recheck(stream)
        if self._at_completions:  # any completion may have written the word they wait on
            self._dirty.extend(self._at_completions)
            self._at_completions.clear()
        if stream.tasks:
            self._dirty.append(stream)
        else:
            drained(stream, task.seq)  # the client may be sleeping on its signal

    def _fail(self, stream: Stream, failure: Failure) -> None:
        context = stream.context
        if context.failure_mode == codes.ACL_STOP_ON_FAILURE:
            if context.failure is None:
                context.failure = failure
            for other in context.streams:
                self.drop_pending(other)
        elif stream.failure is None:
            stream.failure = failure

    def drop_pending(self, stream: Stream) -> None:
        """Discard a stream's tasks that no unit has started (STOP mode, force destroy,
        session end). Their event records fire, so nobody waits on them forever. A launch
        handed out in part goes on -- unless its session has ended: then it stops, its
        blocks not handed out are dropped and its cores skip those they have not started."""
        stopping = stream.owner.closed
        kept = deque(t for t in stream.tasks if t.state != TaskState.PENDING)
        dropped = [t for t in stream.tasks if t.state == TaskState.PENDING]
        stream.tasks = kept
        self._cancel_dispatched(stream, stopping)
        for task in dropped:
            self.discard(task)
        head = kept[0] if kept else None
        if head is None or stopping:  # (a head handed out in part stays ready for the rest)
            self._unready(stream)
        if stopping and isinstance(head, DeviceWork) and head.stop():
            self.complete(head)
        self._recheck(stream)
        if dropped and not stream.tasks:
            if stopping and stream.signal is not None:  # the session ends (the daemon may be
                stream.signal.publish(dropped[-1].seq, True)  # stopping): never ran, not done
            else:
                drained(stream, dropped[-1].seq)

    def abort(self, stream: Stream, stop: bool) -> None:
        """aclrtStreamAbort (`stop` False) or aclrtStreamStop: end the units running the
        stream's head (their kernel processes, workers or copy engines are replaced; the
        launches queued behind it on the same core go back to the queue) and, for an abort,
        discard the queued tasks. What was ended or discarded makes the stream's next
        synchronize fail once with ACL_ERROR_RT_STREAM_ABORT; the stream stays usable
        (after a stop, its queued tasks run next)."""
        tasks = stream.tasks
        if tasks and stream.signal is not None and stream.signal.covers(tasks[-1].seq):
            return  # all of it ran (a unit wrote the signal; its report is on its way)
        head = tasks[0] if tasks else None
        running = (
            head if isinstance(head, DeviceWork) and head.state == TaskState.DISPATCHED else None
        )
        if running is None and (stop or not tasks):
            return
        if stream.failure is None:  # (set first: every signal written from here says so)
            call = "aclrtStreamStop" if stop else "aclrtStreamAbort"
            stream.failure = Failure(
                codes.ACL_ERROR_RT_STREAM_ABORT,
                f"{call} ended task {tasks[0].seq} before it completed",
                tasks[0].seq,
            )
        last_seq = tasks[-1].seq
        if running is not None:
            self._unready(stream)
            for unit in self.devices[stream.device].units[running.unit_kind]:
                works = list(unit.inflight.values())
                if not any(work.stream is stream for work in works):
                    continue
                if unit.lent is not None:
                    unit.lent.take_back()
                self.executor.restart(unit)
                for work in works:  # (a unit runs the work of one stream at a time)
                    if work is running:
                        work.piece_done(self, 0, time.monotonic_ns(), "")
                    else:
                        work.requeue()
            if running.state != TaskState.DONE and running.stop():  # nothing of it is out
                self.complete(running)
        if not stop:
            self.drop_pending(stream)
        if not stream.tasks:
            drained(stream, last_seq)

    def _cancel_dispatched(self, stream: Stream, head: bool) -> None:
        """Tell the cores running kernels of `stream` to skip what they have not started:
        the single-block launches of a run behind the head and, if `head`, the blocks of
        the head's chunks; what is cancelled completes without running."""
        cancelled = {
            t
            for t in itertools.islice(stream.tasks, 0 if head else 1, None)
            if t.state == TaskState.DISPATCHED
        }
        if not cancelled:
            return
        for unit in self.devices[stream.device].units[UnitKind.AI_CORE]:
            tokens = [token for token, work in unit.inflight.items() if work in cancelled]
            if tokens:
                self.executor.cancel(unit, tokens)

    def discard(self, task: Task) -> None:
        """`task` is dropped before it ran: done, its waiters released."""
        task.discarded(self)
        task.state = TaskState.DONE
        task.timestamp = task.stream.clock
        self._release(task)

    def _release(self, task: Task) -> None:
        """Settle the waiters of a task that is done, re-advance the streams waiting for it."""
        for waiter in task.waiters:
            if isinstance(waiter, Waiter):
                waiter.settle()
            else:
                self._dirty.append(waiter)
        task.waiters = []

    def _unready(self, stream: Stream) -> None:
        if stream.queued_ready:
            for ready in self.devices[stream.device].ready.values():
                if stream in ready:
                    ready.remove(stream)
            stream.queued_ready = False

    # ---- handing work to units ----------------------------------------------------------------
    def make_ready(self, stream: Stream, kind: UnitKind) -> None:
        """The head of `stream` is device work for units of `kind`."""
        if not stream.queued_ready:
            self.devices[stream.device].ready[kind].append(stream)
            stream.queued_ready = True

    def hand(self, unit: Unit, work: Any) -> int:
        """A token for a piece of `work` handed to `unit` (its report comes back with it)."""
        token = next(self._tokens)
        unit.inflight[token] = work
        return token

    def _settle_quiet(self) -> None:
        """Let in the `quiet` clients no unit runs work of now."""
        running = {
            owner
            for device in self.devices
            for units in device.units.values()
            for unit in units
            for work in unit.inflight.values()
            for owner in work.owners
        }
        for waiting in [q for q in self._quiet if q.owner not in running]:
            self._quiet.remove(waiting)
            waiting.done.set()

    def _dispatch(self) -> None:
        if self.dispatcher.jobs:  # (matched collectives first: every rank of one waits for them)
            self.dispatcher.dispatch()
        lending = not self.subscribers  # (a subscriber sees every report before the client)
        held = self._held  # clients kept quiet (quiet)
        for device in self.devices:
            for kind, every_ready in device.ready.items():
                ready = [s for s in every_ready if s.owner not in held] if held else every_ready
                if not ready:
                    continue
                units = device.units[kind]
                share, now = None, 0.0
                if kind is UnitKind.AI_CORE:
                    now = time.monotonic()
                    if len(device.core_clients) > 1:
                        share, lapses = core_share(
                            units, ready, device.core_clients, now, self.core_share_window_s
                        )
                        if lapses is not None:
                            self._share_lapses = lapses
                for unit, index in _idle_with_work(units, ready, device.index, share):
                    stream = ready[index]
                    task = stream.tasks[0]
                    assert isinstance(task, DeviceWork)
                    cores = len(units)
                    if kind is UnitKind.AI_CORE:  # its client had its turn (pick_client)
                        owner = stream.owner
                        owner.core_turns[device.index] = next(self._turns)
                        device.core_clients[owner] = now
                        if share is not None:
                            share.took(owner)
                        if _limited(stream):
                            cores = min(cores, _bounding(stream).core_limit(cores))
                    items, whole, finished = task.hand_out(self, unit, cores)
                    if finished:
                        ready.pop(index)
                        if ready is not every_ready:
                            every_ready.remove(stream)
                        stream.queued_ready = False
                    if whole is not None and lending:
                        self._lend(unit, stream, whole.seq, items)
                    self.send(unit, items)

    @staticmethod
    def _lend(unit: Unit, stream: Stream, last_seq: int, items: list) -> None:
        """Have `unit` write the stream's signal after `items`, which end with task
        `last_seq`, when that is the stream's tail and nothing needs the scheduler's
        judgement (a failure to report, STOP mode)."""
        signal = stream.signal
        if (
            signal is None
            or stream.tasks[-1].seq != last_seq
            or stream.context.failure_mode != codes.ACL_CONTINUE_ON_FAILURE
            or _failure_pending(stream)
        ):
            return
        signal.lend()
        items.append(WriteSignal.pack(signal.area.name, signal.slot, last_seq))
        unit.lent = signal

    def send(self, unit: Unit, items: list) -> None:
        """Hand `unit` a batch, with its operator-timeout deadline. A batch of a client's
        own kernels goes to that client's kernel process for the unit (its tenant); the
        executor brings a trusted unit's mappings up to date first (Executor.send)."""
        work = next(iter(unit.inflight.values()))
        timeout = (
            getattr(work, "timeout_s", None) or work.stream.owner.op_timeout_s or self.op_timeout_s
        )
        unit.deadline = time.monotonic() + timeout * len(unit.inflight)
        self.note_deadline(unit.deadline)
        try:
            self.executor.send(unit, items, work.tenant)
        except OSError:
            self._lost(unit, _lost_code(unit), None)

    # ---- reports ------------------------------------------------------------------------------
    def _on_report(self, unit: Unit, report: Any) -> None:
        if report is LOST:
            self._lost(unit, _lost_code(unit), None)
            return
        kind = report.__class__
        if kind is list:  # a batch's results
            self._results(unit, report)
        elif kind is Ready:
            unit.ready = True
        elif kind is tuple:  # a checked kernel's Accesses
            accesses = Accesses._make(report)
            for subscriber in self.subscribers:
                subscriber.accessed(unit, accesses)

    def _results(self, unit: Unit, results: list) -> None:
        """A batch's results: Results, or the plain tuples of them a pipe carries."""
        for subscriber in self.subscribers:
            subscriber.ran(unit, results)  # the timeline: what ran where, when
        unit.deadline = None
        if unit.lent is not None:
            unit.lent.take_back()
            unit.lent = None
        inflight = unit.inflight
        if unit.kind is UnitKind.AI_CORE and inflight:  # its client was active just now
            owner = next(iter(inflight.values())).stream.owner
            self.devices[unit.device].core_clients[owner] = time.monotonic()
        for token, code, start_ns, end_ns, message, output, overflow, failed in results:
            took = end_ns - start_ns
            unit.busy_ns += took
            work = inflight.pop(token)
            if isinstance(work, KernelTask) and work.num_blocks == 1:
                work.function.ran_ns = took  # what task aggregation budgets with
            if failed:  # the failure of a kernel in a run (RunKernels): its own task's
                work.failed_at(failed)
            if output:  # a kernel printed: its client takes it at its next synchronize
                self._printed(work.stream.owner, work.seq, token, output)
            if overflow:  # its context's overflow status (aclrtGetOverflowStatus)
                work.stream.context.overflow = True
            work.piece_done(self, code, end_ns, message)

    def _lost(self, unit: Unit, code: int, how: str | None) -> None:
        """A unit died or timed out (`how` says which; None: find out): fail what it was
        running, replace it, carry on."""
        works = list(unit.inflight.values())
        lent = unit.lent
        ending = self.executor.restart(unit)
        how = how or ending
        log.error("%s %s while running %d task(s); restarting it", unit.name, how, len(works))
        if lent is not None:
            lent.take_back()
        now = time.monotonic_ns()
        for work in works:
            work.piece_done(
                self,
                code,
                now,
                f"{unit.name} {how} while running {work.what} (task {work.seq}); "
                "its process was replaced",
            )

    def _printed(self, owner: Owner, seq: int, token: int, text: str) -> None:
        """Task `seq` of `owner` printed `text`: the next synchronize of any of its streams
        hands it over (docs/acl.md), so every signal of the owner says "ask the daemon",
        also those of streams that drained clean before."""
        if not owner.output.pending:
            for stream in owner.streams():
                if stream.signal is not None:
                    stream.signal.publish(stream.signal.value, True)
        owner.output.add(seq, token, text)

    def rejected(self, owner: Owner, seq: int) -> None:
        """Asynchronous call `seq` of `owner` was rejected (in submission order). Its stream
        may be the one the client sleeps on, waiting for `seq` that will never run: every
        signal of the owner says "done up to `seq`, ask the daemon" (which reports it)."""
        for stream in owner.streams():
            if stream.signal is not None:
                stream.signal.publish(seq, True)

    # ---- waiting ------------------------------------------------------------------------------
    def recheck(self, stream: Stream) -> None:
        """Start the head of `stream` again (a wait whose condition may hold now)."""
        self._dirty.append(stream)

    def recheck_at_completions(self, stream: Stream) -> None:
        """Start the head of `stream` again when the next task completes (aclrtValueWait)."""
        if stream not in self._at_completions:
            self._at_completions.append(stream)

    def watch(
        self, waiter: Waiter, streams: Sequence[Stream] = (), tasks: Sequence[Task] = ()
    ) -> None:
        """Settle `waiter` once `waiter.ready()` holds (checked as the streams/tasks progress)
        or its deadline passes."""
        if waiter.ready():
            waiter.settle()
            return
        for stream in streams:
            stream.watchers.append(waiter)
        for task in tasks:
            task.waiters.append(waiter)
        if waiter.deadline is not None:
            timers = self._timers
            if len(timers) >= self._timers_limit:  # a waiter settled early stays till its deadline
                timers[:] = [timer for timer in timers if not timer[2].finished]
                heapq.heapify(timers)
                self._timers_limit = max(TIMERS_KEPT, 2 * len(timers))
            heapq.heappush(timers, (waiter.deadline, next(self._timer_ids), waiter))
            self.note_deadline(waiter.deadline)

    def _recheck(self, stream: Stream) -> None:
        if not stream.watchers:
            return
        pending = []
        for waiter in stream.watchers:
            if waiter.finished:
                continue
            if waiter.ready():
                waiter.settle()
            else:
                pending.append(waiter)
        stream.watchers = pending

    def _next_timeout(self) -> float:
        """Seconds until the nearest deadline, at most NAP_S."""
        deadlines = [unit.deadline for unit in self.executor.units if unit.deadline is not None]
        if self._timers:
            deadlines.append(self._timers[0][0])
        if self.dispatcher.deadline is not None:
            deadlines.append(self.dispatcher.deadline)
        if self._share_lapses is not None:  # a core kept for a client may be handed out then
            if self._share_lapses > time.monotonic():
                deadlines.append(self._share_lapses)
            else:
                self._share_lapses = None
        if not deadlines:
            return NAP_S
        return min(max(0.0, min(deadlines) - time.monotonic()), NAP_S)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, waiter = heapq.heappop(self._timers)
            waiter.settle(timed_out=True)
        deadline = self.dispatcher.deadline
        if deadline is not None and deadline <= now:
            self.dispatcher.expire(now)
        for unit in self.executor.units:
            if unit.deadline is not None and unit.deadline <= now and unit.inflight:
                self._lost(
                    unit,
                    codes.ACL_ERROR_RT_AICORE_TIMEOUT,
                    "exceeded the operator execution timeout",
                )
        if self._dirty:
            self._pump()


class _Quiet:
    """A client waiting for a moment when no unit runs its work (Scheduler.quiet)."""

    __slots__ = ("done", "error", "owner")

    def __init__(self, owner: Owner):
        self.owner = owner
        self.done = threading.Event()
        self.error: Exception | None = None


def _idle_with_work(
    units: Sequence[Unit], ready: list[Stream], device: int, share: CoreShare | None = None
) -> Iterator[tuple[Unit, int]]:
    """(idle unit, index of the ready stream it should serve) while both remain; an AI core
    serves only a client under its `share` (server/core/core_shares.py), if there is one,
    and the caller counts what it hands out in the share."""
    for unit in units:
        if not ready:
            return
        if not unit.ready or unit.inflight:
            continue
        if unit.kind is not UnitKind.AI_CORE:
            yield unit, (pick_stream([s.priority for s in ready]) if len(ready) > 1 else 0)
        elif share is not None or any(_limited(s) for s in ready):
            allowed = [
                i
                for i, s in enumerate(ready)
                if (share is None or share.may_take(s.owner))
                and (not _limited(s) or _may_run(s, unit, len(units)))
            ]
            if allowed:
                yield unit, _in_turn(ready, allowed, device)
        elif len(ready) == 1:
            yield unit, 0
        else:
            yield unit, _in_turn(ready, range(len(ready)), device)


def _in_turn(ready: list[Stream], allowed: Sequence[int], device: int) -> int:
    """Which of the ready streams at `allowed` (indices into `ready`) a free AI core of
    `device` serves: the client whose turn it is (`pick_client`), then its own streams in
    their order (`pick_stream`)."""
    first = ready[allowed[0]].owner
    for i in allowed:
        if ready[i].owner is not first:
            break
    else:  # one client
        return allowed[pick_stream([ready[i].priority for i in allowed])]
    turns = [ready[i].owner.core_turns.get(device, 0) for i in allowed]
    chosen = ready[allowed[pick_client(turns)]].owner
    mine = [i for i in allowed if ready[i].owner is chosen]
    if len(mine) == 1:
        return mine[0]
    return mine[pick_stream([ready[i].priority for i in mine])]


def _bounding(stream: Stream) -> Stream:
    """The stream whose core limits bound the work at the head of ready `stream`: its own,
    or the one its launching thread used (aclrtUseStreamResInCurrentThread)."""
    return stream.tasks[0].limits_from or stream


def _limited(stream: Stream) -> bool:
    """Whether the work at the head of ready `stream` may have a core limit."""
    bounding = _bounding(stream)
    return bool(bounding.owner.core_limits or bounding.res_limits)


def _may_run(stream: Stream, unit: Unit, cores: int) -> bool:
    """Whether `unit` (an AI core of `cores`) may run the work at the head of `stream`: the
    core limit in force (aclrtSetStreamResLimit, else aclrtSetDeviceResLimit) admits only
    the first cores."""
    return unit.index < _bounding(stream).core_limit(cores)


def pick_stream(priorities: list[int]) -> int:
    """Index of the ready stream to serve next: the highest priority (lowest number) wins,
    and among equals the one that has been ready longest (the earliest in the list)."""
    best = 0
    for index in range(1, len(priorities)):
        if priorities[index] < priorities[best]:
            best = index
    return best


def pick_client(turns: list[int]) -> int:
    """Index of the ready stream whose client a free AI core serves next, by `turns`: for
    each ready stream, when its client last got an AI core of the device (0: never). The
    client that has waited longest since its last turn wins, and among clients never served
    the one whose stream has been ready longest (the earliest in the list). So every client
    with ready work gets the next free core in turn, whatever its number of streams; stream
    priorities order a client's own streams only (`pick_stream`)."""
    best = 0
    for index in range(1, len(turns)):
        if turns[index] < turns[best]:
            best = index
    return best


def _failure_pending(stream: Stream) -> bool:
    """Would a synchronize of `stream` have something to report now: a failure, or device
    output (server/units/device_printf.py) that its reply carries?"""
    return (
        stream.failure is not None
        or (stream.recorder is not None and stream.recorder.refuses_synchronize)  # (107027)
        or stream.context.failure is not None
        or stream.owner.rejected is not None
        or stream.owner.output.pending
    )


def drained(stream: Stream, seq: int) -> None:
    """`stream` ran (or dropped) everything up to `seq` and has nothing queued."""
    if stream.signal is not None:
        stream.signal.publish(max(seq, stream.recorded_upto), _failure_pending(stream))


def _lost_code(unit: Unit) -> int:
    """The ACL code of tasks lost with their unit: an AI-core exception, or a DMA error."""
    return (
        codes.ACL_ERROR_RT_AICORE_EXCEPTION
        if unit.kind is UnitKind.AI_CORE
        else codes.ACL_ERROR_RT_SYS_DMA
    )
