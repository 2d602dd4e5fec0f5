"""The scheduler: every stream queue, event and worker of the daemon, behind one lock.

Sessions post batches of (function, args); `post` runs them in order under the lock on
the session's own thread, then dispatches whatever became ready, so a launch reaches its
worker without waking another thread. The scheduler thread sleeps in one wait() on all
worker pipes (plus a wake-up pipe for new deadlines and replaced workers) and handles
results and timeouts under the same lock, so an idle daemon burns no CPU.

Per stream, tasks run strictly in order: only the head task is ever on a worker (except
a run of single-block launches handed to one core at once, which that core also runs in
order). Event records, waits and resets are executed by the scheduler itself when they
reach the head. Launches are split into block ranges over the device's free AI cores;
copies and memsets go to its copy engines. Higher-priority ready streams are served first.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import select
import threading
import time
from collections import deque

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server import policy
from simnpu.server.collectives import Collectives
from simnpu.server.objects import (
    COLLECTIVE,
    COLLECTIVE_WORK,
    COPY,
    DISPATCHED,
    DONE,
    HOST,
    KERNEL,
    MEMSET,
    PENDING,
    RECORD,
    RESET,
    WAIT,
    DeviceArgs,
    Failure,
    Task,
    Waiter,
)
from simnpu.server.worker_pool import AI_CORE

log = logging.getLogger("simnpu.scheduler")

# The longest the scheduler thread sleeps. A deadline further away than this needs no
# wake-up when it is set (the thread sees it at its next turn), so handing a worker its
# work -- whose deadline is the operator timeout away, 300 s by default -- costs no
# wake-up of this thread; an idle daemon wakes once per NAP_S, which costs nothing.
NAP_S = 1.0
_CATCH_UP_S = 5.0  # the longest catch_up waits for a result whose word is written


class Scheduler:
    def __init__(self, devices, op_timeout_s: float):
        self.devices = devices
        self.op_timeout_s = op_timeout_s
        self._lock = threading.RLock()  # held while any scheduler state is read or changed
        self._sleep_until = 0.0  # when the scheduler thread's wait() returns by itself
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._timers: list = []
        self._timer_ids = itertools.count()
        self._dirty: deque = deque()
        self._tokens = itertools.count(1)
        self._stopping = False
        self._workers = [w for d in devices for w in d.cores + d.engines]
        self._workers_generation = 0  # bumped whenever a worker (and its pipe) is replaced
        self._side_reads = 0  # worker results taken by catch_up, not by the scheduler thread
        self._poller_generation = -1
        self._thread = threading.Thread(target=self._run, name="simnpu-scheduler", daemon=True)
        self.collectives = Collectives(self)  # HCCL communicators (server/collectives.py)
        self.observer = None  # tracing and checking (server/observe.py), when asked for
        self._started_ns = time.monotonic_ns()

    # ---- any thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def post(self, batch: list) -> None:
        """Run each (function, args) of `batch` in order under the scheduler lock, then hand
        out the work that became ready. Runs on the caller's thread; returns when done."""
        with self._lock:
            for function, args in batch:
                try:
                    function(*args)
                except Exception:
                    log.exception("scheduler operation %s failed", getattr(function, "__name__", function))
            self._pump()

    def call(self, function, *args) -> None:
        self.post([(function, args)])

    def _wake(self) -> None:
        """Make the scheduler thread re-read its pipes and deadlines."""
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def _note_deadline(self, deadline: float) -> None:
        if deadline < self._sleep_until:
            self._wake()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        self._thread.join(10)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def utilisation(self, device) -> float:
        """Fraction of the device's AI-core time spent executing since the daemon started.
        Reads counters without the lock (a monitoring figure)."""
        cores = device.cores
        busy = sum(w.busy_ns for w in cores)
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
        with self._lock:
            timeout = self._next_timeout()
            self._sleep_until = time.monotonic() + timeout
            if self._poller_generation != self._workers_generation:
                self._rebuild_poller()
            generation, by_fd, side_reads = self._poller_generation, self._worker_by_fd, self._side_reads
        events = self._poller.poll(math.ceil(timeout * 1000))
        with self._lock:
            self._sleep_until = 0.0  # awake: nobody needs to wake this thread
            for fd, _ in events:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 65536)
                    except BlockingIOError:
                        pass
                elif generation != self._workers_generation:  # a pipe was replaced meanwhile
                    continue
                elif side_reads == self._side_reads or select.select([fd], [], [], 0)[0]:
                    self._on_worker_message(by_fd[fd])  # (catch_up may have taken it already)
            self._pump()
            self._expire()

    def _rebuild_poller(self) -> None:
        """One poll object over the wake-up pipe and every worker pipe, rebuilt only when a
        worker is replaced (multiprocessing's wait() builds a selector on every call)."""
        self._poller = select.poll()
        self._poller.register(self._wake_r, select.POLLIN)
        self._worker_by_fd = {w.conn.fileno(): w for w in self._workers}
        for fd in self._worker_by_fd:
            self._poller.register(fd, select.POLLIN)
        self._poller_generation = self._workers_generation

    def _pump(self) -> None:
        while True:
            while self._dirty:
                self._advance(self._dirty.popleft())
            self._dispatch()
            if not self._dirty:
                return

    # ---- stream progress ------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        """Queue a task at the tail of its stream."""
        stream = task.stream
        if task.kind == RECORD:
            task.payload[0].latest_record = task
        elif task.kind == WAIT:  # a wait binds to the latest record at the time of the wait
            task.payload = (task.payload[0].latest_record,)
        if self.observer is not None:
            self.observer.submitted(task)
        if stream.context.failure is not None:  # stopped on failure: nothing more runs
            self._discard(task)
            if not stream.tasks:
                stream.session.stream_drained(stream, task.seq)
            return
        if not stream.tasks:
            stream.clock = max(stream.clock, time.monotonic_ns())
            stream.tasks.append(task)
            self._dirty.append(stream)
        else:
            stream.tasks.append(task)

    def _advance(self, stream) -> None:
        """Execute the control tasks at the head of `stream`; queue device work as ready."""
        tasks = stream.tasks
        while tasks:
            task = tasks[0]
            if task.state != PENDING:
                return
            kind = task.kind
            if kind == RECORD:
                task.timestamp = stream.clock
                self._complete(task)
            elif kind == WAIT:
                record = task.payload[0]
                if record is not None and record.state != DONE:
                    if stream not in record.waiters:
                        record.waiters.append(stream)
                    return
                if record is not None:
                    stream.clock = max(stream.clock, record.timestamp)
                self._complete(task)
            elif kind == RESET:
                event = task.payload[0]
                if event.latest_record is not None and event.latest_record.state == DONE:
                    event.latest_record = None
                self._complete(task)
            elif kind == HOST:
                callback, blocking = task.payload
                stream.session.run_host_callback(callback, task if blocking else None)
                if blocking:
                    task.state = DISPATCHED
                    return
                self._complete(task)
            elif kind == KERNEL and isinstance(task.payload[2], DeviceArgs) and not self._read_args(task):
                continue  # the arguments could not be read: the launch failed
            elif kind == COLLECTIVE:  # waits for the other ranks, unless it failed at once
                self.collectives.arrive(task)
                if task.state != DONE:
                    return
            else:
                if not stream.queued_ready:
                    device = self.devices[stream.device]
                    (device.ready_kernels if kind == KERNEL else device.ready_copies).append(stream)
                    stream.queued_ready = True
                return

    def _read_args(self, task: Task) -> bool:
        """Read a launch's arguments from device memory, now that every task before it on
        its stream has finished; False (the task failed and completed) if they cannot be."""
        binary, name, args, num_blocks, _ = task.payload
        try:
            values, bounds = args.read()
        except NpuError as error:
            task.failure = Failure(error.code, f"launch arguments of kernel {name}: {error.message}", task.seq)
            self._complete(task)
            return False
        task.payload = (binary, name, values, num_blocks, bounds)
        return True

    def host_done(self, task: Task) -> None:
        """The client finished a blocking host callback: the stream goes on."""
        if task.state == DISPATCHED:
            task.timestamp = time.monotonic_ns()
            self._complete(task)

    def _complete(self, task: Task) -> None:
        if task.probe:  # observed (a traced-only kernel or copy has False: nothing to do here)
            self.observer.completing(task)
        task.state = DONE
        stream = task.stream
        head = stream.tasks.popleft()
        assert head is task, "tasks complete in stream order"
        if task.kind in (KERNEL, COPY, MEMSET, HOST):
            stream.clock = max(stream.clock, task.timestamp)
        if task.failure is not None:
            self._fail(stream, task.failure)
        for waiter in task.waiters:
            if isinstance(waiter, Waiter):
                waiter.settle()
            else:
                self._dirty.append(waiter)
        task.waiters = []
        self._recheck(stream)
        if stream.tasks:
            self._dirty.append(stream)
        elif stream.notify_slot >= 0:  # the client may be sleeping on its word (docs/fast-path.md)
            stream.session.stream_drained(stream, task.seq)

    def _fail(self, stream, failure: Failure) -> None:
        context = stream.context
        if context.failure_mode == codes.ACL_STOP_ON_FAILURE:
            if context.failure is None:
                context.failure = failure
            for other in context.streams:
                self.drop_pending(other)
        elif stream.failure is None:
            stream.failure = failure

    def drop_pending(self, stream) -> None:
        """Discard a stream's tasks that no worker has started (STOP mode, force destroy,
        session end). Their event records fire, so nobody waits on them forever."""
        kept = deque(t for t in stream.tasks if t.state != PENDING)
        dropped = [t for t in stream.tasks if t.state == PENDING]
        stream.tasks = kept
        self._cancel_run(stream)
        for task in dropped:
            self._discard(task)
        self._unready(stream)
        self._recheck(stream)
        if dropped and not stream.tasks:
            stream.session.stream_drained(stream, dropped[-1].seq)

    def _cancel_run(self, stream) -> None:
        """Tell the core running a run of single-block launches of `stream` to skip those
        behind the head that it has not started yet; they complete without running."""
        queued = {t for t in itertools.islice(stream.tasks, 1, None) if t.state == DISPATCHED}
        if not queued:
            return
        for core in self.devices[stream.device].cores:
            tokens = [token for token, task in core.inflight.items() if task in queued]
            if tokens:
                try:
                    core.conn.send(("cancel", tokens))
                except (OSError, ValueError):  # the core died: _worker_lost fails the tasks
                    pass

    def _discard(self, task: Task) -> None:
        if task.kind == COLLECTIVE:  # the other ranks must not wait for it
            self.collectives.discarded(task)
        task.state = DONE
        task.timestamp = task.stream.clock
        for waiter in task.waiters:
            if isinstance(waiter, Waiter):
                waiter.settle()
            else:
                self._dirty.append(waiter)
        task.waiters = []

    def _unready(self, stream) -> None:
        if stream.queued_ready:
            device = self.devices[stream.device]
            for ready in (device.ready_kernels, device.ready_copies):
                if stream in ready:
                    ready.remove(stream)
            stream.queued_ready = False

    # ---- handing work to workers ------------------------------------------------------------
    def _dispatch(self) -> None:
        if self.collectives.jobs:  # matched collectives first: every rank of one waits for them
            self.collectives.dispatch()
        for device in self.devices:
            if device.ready_kernels:
                self._dispatch_kernels(device)
            if device.ready_copies:
                self._dispatch_copies(device)

    def _dispatch_kernels(self, device) -> None:
        ready = device.ready_kernels
        for core, index in _idle_with_work(device.cores, ready):
            stream = ready[index]
            task = stream.tasks[0]
            num_blocks = task.payload[3]
            first = task.blocks_next
            last = min(num_blocks, first + policy.block_chunk(num_blocks - first, len(device.cores)))
            items: list = []
            self._add_kernel_item(core, task, first, last, items)
            if last == num_blocks:
                ready.remove(stream)
                stream.queued_ready = False
                if num_blocks == 1 and stream.context.failure_mode == codes.ACL_CONTINUE_ON_FAILURE:
                    task = self._add_run(core, stream, items)
                if first == 0 and stream.notify_slot >= 0:  # the whole of it runs on this core
                    self._add_notify(core, stream, task, items)
            self._send(core, items)

    def _add_kernel_item(self, core, task, first, last, items) -> None:
        binary, name, args, num_blocks, bounds = task.payload
        if binary.id not in core.loaded:
            items.append(("load", binary.id, binary.source, binary.filename))
            core.loaded.add(binary.id)
        token = next(self._tokens)
        core.inflight[token] = task
        if self.observer is not None and self.observer.tracing and last - first < num_blocks:
            self.observer.blocks[token] = (first, last)  # the timeline names a partial launch's blocks
        task.state = DISPATCHED
        task.blocks_next = last
        task.chunks_out += 1
        items.append(("kernel", token, binary.id, name, args, first, last, num_blocks, bounds))

    def _add_run(self, core, stream, items):
        """Add the single-block launches queued behind the head to its core's items; returns
        the last task of the run."""
        following = []
        for task in itertools.islice(stream.tasks, 1, policy.MAX_RUN):
            if task.kind != KERNEL or task.state != PENDING or isinstance(task.payload[2], DeviceArgs):
                break  # arguments in device memory are read only once the tasks before have run
            following.append(task)
        count = policy.run_length([t.payload[3] for t in following])
        for task in following[:count]:
            self._add_kernel_item(core, task, 0, 1, items)
        return following[count - 1] if count else stream.tasks[0]

    @staticmethod
    def _add_notify(worker, stream, last, items) -> None:
        """Have the worker write the stream's word after `items`, when they end at its tail
        and nothing needs the scheduler's judgement (server/session_fastpath.py)."""
        item = stream.session.notify_item(stream, last.seq)
        if item is not None:
            items.append(item)
            worker.notify_seq = (stream, last.seq)

    def _dispatch_copies(self, device) -> None:
        ready = device.ready_copies
        for engine, index in _idle_with_work(device.engines, ready):
            stream = ready[index]
            task = stream.tasks[0]
            count = task.payload[2]
            if not task.pieces:  # the hidden stream of synchronous copies has priority -1
                task.pieces = policy.copy_pieces(count, len(device.engines), stream.priority < 0)
            start, end = policy.piece_range(count, task.pieces, task.blocks_next)
            task.blocks_next += 1
            if task.blocks_next == task.pieces:
                ready.pop(index)
                stream.queued_ready = False
            token = next(self._tokens)
            engine.inflight[token] = task
            task.state = DISPATCHED
            task.chunks_out += 1
            items = [_copy_piece(task, token, start, end)]
            if task.pieces == 1 and stream.notify_slot >= 0:
                self._add_notify(engine, stream, task, items)
            self._send(engine, items)

    def send_work(self, worker, work, kind: str, *fields) -> None:
        """Hand `worker` one item (kind, token, *fields) for `work`, a task-like object whose
        result comes back through _chunk_done (collectives' data movement)."""
        token = next(self._tokens)
        worker.inflight[token] = work
        self._send(worker, [(kind, token, *fields)])

    def _send(self, worker, items) -> None:
        task = next(iter(worker.inflight.values()))
        timeout = task.stream.session.op_timeout_s or self.op_timeout_s
        worker.deadline = time.monotonic() + timeout * len(worker.inflight)
        self._note_deadline(worker.deadline)
        try:
            worker.send(items)
        except (OSError, ValueError):
            self._worker_lost(worker, _death_code(worker), worker.exit_description())

    # ---- results ------------------------------------------------------------------------------
    def _on_worker_message(self, worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._worker_lost(worker, _death_code(worker), worker.exit_description())
            return
        if message.__class__ is tuple:
            if message == ("ready",):
                worker.ready = True
            elif self.observer is not None:  # ("accesses", ...) of a checked kernel
                self.observer.worker_notice(worker, message)
            return
        if self.observer is not None and self.observer.tracing:
            self.observer.ran(worker, message)  # the timeline: what ran where, when
        worker.deadline = worker.notify_seq = None
        for token, code, start, end, text in message:
            task = worker.inflight.pop(token)
            worker.busy_ns += end - start
            self._chunk_done(task, code, end, text)

    def _chunk_done(self, task, code, end_ns, text) -> None:
        if code and task.failure is None:
            task.failure = Failure(code, text, task.seq)
        task.timestamp = max(task.timestamp, end_ns)
        if task.kind == KERNEL:
            task.chunks_out -= 1
            if task.chunks_out or task.blocks_next < task.payload[3]:
                return
        elif task.kind in (COPY, MEMSET):
            task.chunks_out -= 1
            if task.chunks_out or task.blocks_next < task.pieces:
                return
        elif task.kind == COLLECTIVE_WORK:
            self.collectives.work_done(task)
            return
        self._complete(task)

    def _worker_lost(self, worker, code: int, how: str) -> None:
        """A worker died or timed out: fail what it was running, replace it, carry on."""
        tasks = list(worker.inflight.values())
        worker.kill()
        log.error("%s %s while running %d task(s); restarting it", worker.name, how, len(tasks))
        now = time.monotonic_ns()
        for task in tasks:
            what = task.payload[1] if task.kind == KERNEL else task.kind
            self._chunk_done(task, code, now, f"{worker.name} {how} while running {what} "
                                              f"(task {task.seq}); the worker was replaced")
        worker.restarts += 1
        worker.start()
        self._workers_generation += 1
        self._wake()  # the scheduler thread must poll the new pipe

    def catch_up(self, stream) -> None:
        """Take the results of workers that already told the client, through `stream`'s word,
        that they finished its work: what the daemon answers next must agree with what the
        client saw. Under the lock; waits at most a moment for a result on its way."""
        for worker in self._workers:
            told = worker.notify_seq
            if told is not None and told[0] is stream and stream.session.word_says(stream, told[1]):
                if select.select([worker.conn], [], [], _CATCH_UP_S)[0]:
                    self._side_reads += 1
                    self._on_worker_message(worker)

    # ---- waiting ------------------------------------------------------------------------------
    def watch(self, waiter: Waiter, streams=(), tasks=()) -> None:
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
            heapq.heappush(self._timers, (waiter.deadline, next(self._timer_ids), waiter))
            self._note_deadline(waiter.deadline)

    def _recheck(self, stream) -> None:
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
        deadlines = [w.deadline for w in self._workers if w.deadline is not None]
        if self._timers:
            deadlines.append(self._timers[0][0])
        if self.collectives.deadline is not None:
            deadlines.append(self.collectives.deadline)
        if not deadlines:
            return NAP_S
        return min(max(0.0, min(deadlines) - time.monotonic()), NAP_S)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, waiter = heapq.heappop(self._timers)
            waiter.settle(timed_out=True)
        if self.collectives.deadline is not None and self.collectives.deadline <= now:
            self.collectives.expire(now)
        for worker in self._workers:
            if worker.deadline is not None and worker.deadline <= now and worker.inflight:
                self._worker_lost(worker, codes.ACL_ERROR_RT_AICORE_TIMEOUT,
                                  "exceeded the operator execution timeout")
        if self._dirty:
            self._pump()


def _idle_with_work(workers, ready):
    """(idle worker, index of the ready stream it should serve) while both remain."""
    for worker in workers:
        if not ready:
            return
        if worker.idle:
            yield worker, policy.pick_stream([s.priority for s in ready])


def _copy_piece(task, token, start: int, end: int) -> tuple:
    """The work item for bytes [start, end) of a copy (dst, src, count) or memset (dst, value, count)."""
    def shifted(location):
        space, key, offset = location
        return (space, key, offset + start)

    if task.kind == COPY:
        dst, src, _ = task.payload
        return (COPY, token, shifted(dst), shifted(src), end - start)
    dst, value, _ = task.payload
    return (MEMSET, token, shifted(dst), value, end - start)


def _death_code(worker) -> int:
    """The ACL code of tasks lost with their worker: an AI-core exception, or a DMA error."""
    return codes.ACL_ERROR_RT_AICORE_EXCEPTION if worker.kind == AI_CORE else codes.ACL_ERROR_RT_SYS_DMA
