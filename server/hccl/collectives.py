"""HCCL collectives in the daemon: matching the ranks' calls, running them, failing them.

Collectives are tasks on the ranks' streams. When one reaches the head of its stream the
scheduler calls `arrive`: the task waits under its key -- ("c", k) for the rank's k-th
collective on the communicator, ("p", src, dst, j) for the j-th send/recv of a pair --
until every rank taking part has arrived. A rank that arrives with a different call fails
the key at once on every rank, the message naming each rank and what it called. When all
match, the data movement is planned (server/hccl/reduce_plan.py) and handed to the AI cores of the
ranks' devices; every rank's task completes when the last piece does.

Failures are task failures, reported at the next synchronize with an ACL code (and kept
for HcclGetCommAsyncError as an HcclResult): mismatch 107000 / HCCL_E_PARA, waiting
longer than HCCL_EXEC_TIMEOUT 107020 / HCCL_E_TIMEOUT, a rank whose process ended (or
that destroyed the communicator, or dropped its task) 507904 / HCCL_E_REMOTE.

Communicators themselves (root info, init, destroy) are server/hccl/communicators.py; the
rank's task is server/hccl/collective_task.py, made by server/control/handlers/hccl_calls.py
on the session's thread (its arguments checked by server/hccl/call_arguments.py). Everything
here runs under the scheduler, which owns all the state.
"""

from __future__ import annotations

import heapq
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from simnpu.proto import hccl_types as ht
from simnpu.server.core.executor import UnitKind
from simnpu.server.core.streams import Failure
from simnpu.server.core.tasks import TaskState
from simnpu.server.core.unit_protocol import ReducePiece, Span
from simnpu.server.hccl import reduce_plan
from simnpu.server.hccl.collective_task import CollectiveTask
from simnpu.server.hccl.communicators import Communicator, Communicators, Member, rank_list
from simnpu.server.hccl.failure_codes import DESTROYED, MISMATCH, REMOTE, TIMEOUT
from simnpu.server.hccl.world_membership import Worlds

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.memory.device_memory import DeviceWithMemory


# ---- what a rank called --------------------------------------------------------------------------
class Call(NamedTuple):
    kind: int
    elements: int  # the call's own count: sendCount (all_gather), recvCount (reduce_scatter), ...
    dtype: int
    op: int
    root: int  # root (broadcast, reduce) or peer (send, recv)
    send: Span
    recv: Span
    recv_count: int
    recv_dtype: int
    send_bytes: int  # what the rank's call reads of `send`
    recv_bytes: int  # and writes of `recv`

    def signature(self) -> tuple:
        """What must be equal on every rank (send and recv of a pair compare count and type)."""
        kind = self.kind
        if kind in ht.POINT_TO_POINT:
            return (self.elements, self.dtype)
        if kind == ht.HCCL_CMD_BARRIER:
            return (kind,)
        return (
            kind,
            self.elements,
            self.dtype,
            self.op if kind in ht.REDUCING else None,
            self.root if kind in ht.ROOTED else None,
            (self.recv_count, self.recv_dtype) if kind == ht.HCCL_CMD_ALLTOALL else None,
        )

    def describe(self) -> str:
        kind, name = self.kind, ht.COLLECTIVE_NAMES.get(self.kind, f"collective {self.kind}")
        dtype = ht.SHORT_DTYPE_NAMES.get(self.dtype, str(self.dtype))
        if kind == ht.HCCL_CMD_BARRIER:
            return "barrier()"
        if kind == ht.HCCL_CMD_SEND:
            return f"send(count={self.elements}, {dtype}, to rank {self.root})"
        if kind == ht.HCCL_CMD_RECEIVE:
            return f"recv(count={self.elements}, {dtype}, from rank {self.root})"
        if kind == ht.HCCL_CMD_ALLTOALL:
            recv_dtype = ht.SHORT_DTYPE_NAMES.get(self.recv_dtype, str(self.recv_dtype))
            return (
                f"alltoall(send_count={self.elements}, {dtype}, "
                f"recv_count={self.recv_count}, {recv_dtype})"
            )
        label = {
            ht.HCCL_CMD_ALLGATHER: "send_count",
            ht.HCCL_CMD_REDUCE_SCATTER: "recv_count",
            ht.HCCL_CMD_SCATTER: "recv_count",
        }.get(kind, "count")
        parts = [f"{label}={self.elements}", dtype]
        if kind in ht.REDUCING:
            parts.append(ht.REDUCE_OP_NAMES.get(self.op, str(self.op)))
        if kind in ht.ROOTED:
            parts.append(f"root={self.root}")
        return f"{name}({', '.join(parts)})"


# ---- state ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Op:
    """Collective `key` of a communicator, arrived at by some of its ranks."""

    key: tuple
    ranks: tuple  # the ranks taking part
    arrivals: dict[int, CollectiveTask] = field(default_factory=dict)  # rank -> its task
    deadline: float | None = None
    done: bool = False


@dataclass(eq=False)
class Job:
    """The data movement of one matched collective: what the scheduler hands AI cores, a
    piece per core; its ranks' tasks complete when the last piece has reported."""

    collectives: Collectives  # whose job it is
    comm: Communicator
    op: Op
    tasks: list[CollectiveTask]
    call: Call
    groups: list
    snapshot: bool
    pieces: list
    cores: list[Unit]  # the AI cores of the ranks' devices
    parallel: int  # how many of them may work on it at once
    failure: Failure | None = None
    timestamp: int = 0
    next_piece: int = 0
    out: int = 0
    on_done: Callable | None = None  # a phase across hosts: called instead of finishing
    what = "collective work"  # how a lost unit's message names it
    probe = None  # never observed itself (its ranks' tasks are)
    tenant = None  # daemon code: trusted workers run it (Scheduler.send)

    @property
    def stream(self):
        return self.tasks[0].stream

    @property
    def owners(self) -> tuple[Owner, ...]:
        """The ranks' clients, whose memory its pieces touch (Scheduler.holds)."""
        return tuple(task.stream.owner for task in self.tasks)

    @property
    def seq(self) -> int:
        return self.tasks[0].seq

    def piece_done(self, scheduler: Scheduler, code: int, end_ns: int, message: str) -> None:
        """A core reported its piece (or was lost with it)."""
        if code and self.failure is None:
            self.failure = Failure(code, message, self.seq)
        self.timestamp = max(self.timestamp, end_ns)
        self.collectives.work_done(self)


class Collectives:
    """The collectives of every communicator of the daemon, on `devices`. The scheduler's
    dispatcher (server/core/dispatcher.py): its matched collectives go out before the
    streams' work."""

    def __init__(self, scheduler: Scheduler, devices: Sequence[DeviceWithMemory]):
        self.scheduler = scheduler
        self.devices = devices
        self.worlds = Worlds(self)  # communicators whose ranks span hosts
        self.communicators = Communicators(scheduler, self.worlds)
        self.jobs: list[Job] = []
        self.deadline: float | None = None  # the earliest exec-timeout deadline of a waiting op
        self._heap: list = []
        self._heap_ids = itertools.count()
        self._live = 0
        cpus = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        # the cores one collective's data movement spreads over (more than the host's CPUs
        # only adds wake-ups)
        self._cpus = max(1, int(os.environ.get("SIMNPU_HCCL_MAX_CORES", cpus)))

    # ==== collectives (scheduler thread) =========================================================
    def arrive(self, task: CollectiveTask) -> None:
        """A collective task reached the head of its stream: wait for its peers, run it when
        all have come, or fail it."""
        member, key, call = task.member, task.key, task.call
        comm = member.comm
        assert comm is not None, "collectives are queued on formed communicators only"
        task.state = TaskState.DISPATCHED
        if key is None:  # replayed after its rank destroyed the communicator: it has no place
            self._finish(
                task,
                DESTROYED,
                f"{call.describe()} (captured in a model) cannot run: {member.describe()} "
                f"destroyed communicator {comm.id} (HcclCommDestroy) before this replay",
            )
            return
        if comm.broken is not None:
            self._finish(
                task,
                comm.broken[0],
                f"{call.describe()} ({comm.title(key)}): {comm.broken[1]}",
            )
            return
        failed = comm.failed.get(key)
        if failed is not None:
            outcome, message, to_come = failed
            to_come.discard(member.rank)
            if not to_come:
                del comm.failed[key]
            self._finish(
                task,
                outcome,
                f"{message}\n(rank {member.rank} arrived later with {call.describe()})",
            )
            return
        op = comm.ops.get(key)
        if op is None:
            op = comm.ops[key] = Op(key, comm.ranks_of(key))
            self._watch_deadline(comm, op)
        op.arrivals[member.rank] = task
        if not self._matches(comm, op):
            return
        gone = [
            r
            for r in op.ranks
            if r not in op.arrivals
            and comm.members[r].state == "destroyed"
            and comm.members[r].never_reaches(key)
        ]
        if gone:
            self._fail_op(
                comm,
                op,
                REMOTE,
                f"{comm.title(key)} cannot run: "
                + "; ".join(
                    f"{comm.members[r].describe()} destroyed the communicator before submitting it"
                    for r in gone
                ),
            )
            return
        if len(op.arrivals) == len(op.ranks):
            self._op_done(comm, op)
            self._execute(comm, op)

    def _matches(self, comm: Communicator, op: Op) -> bool:
        """False (and the op failed on every rank that arrived) if the calls differ."""
        calls = {rank: task.call for rank, task in op.arrivals.items()}
        if len({call.signature() for call in calls.values()}) == 1:
            if op.key[0] == "c" or len(calls) < 2:
                return True
            send, recv = calls[op.key[1]], calls[op.key[2]]
            if send.kind == ht.HCCL_CMD_SEND and recv.kind == ht.HCCL_CMD_RECEIVE:
                return True
        called = "; ".join(
            f"{comm.members[rank].describe()} called {calls[rank].describe()}"
            for rank in sorted(calls)
        )
        missing = [r for r in op.ranks if r not in calls]
        later = f"; {rank_list(missing)} had not reached it yet" if missing else ""
        self._fail_op(comm, op, MISMATCH, f"HCCL mismatch at {comm.title(op.key)}: {called}{later}")
        return False

    def _fail_op(self, comm: Communicator, op: Op, outcome: tuple, message: str) -> None:
        """Fail every rank waiting in `op`; ranks that arrive at its key later fail too. A
        world across hosts breaks: the other hosts' ranks never get this collective."""
        self._op_done(comm, op)
        to_come = {r for r in op.ranks if r not in op.arrivals}
        if to_come:
            comm.failed[op.key] = (outcome, message, to_come)
        for task in list(op.arrivals.values()):
            self._finish(task, outcome, message)
        if comm.world is not None:
            self.worlds.break_world(comm.world, f"on {comm.world.here()}: {message}")

    def _op_done(self, comm: Communicator, op: Op) -> None:
        comm.ops.pop(op.key, None)
        if not op.done:
            op.done = True
            if op.deadline is not None:
                self._live -= 1
                self._refresh_deadline()

    def _finish(
        self, task, outcome: tuple | None = None, message: str = "", end_ns: int | None = None
    ) -> None:
        """Complete one rank's collective task (failed if `outcome` is given)."""
        end = end_ns if end_ns is not None else time.monotonic_ns()
        task.timestamp = end
        stream = task.stream
        stream.clock = max(stream.clock, end)
        if outcome is not None:
            task.fail(outcome[0], message)
            member = task.member
            if member.error is None:
                member.error = (outcome[1], message)
        self.scheduler.complete(task)

    # ---- execution ------------------------------------------------------------------------------
    def _execute(self, comm: Communicator, op: Op) -> None:
        tasks = [op.arrivals[rank] for rank in op.ranks]
        if comm.world is not None and op.key[0] == "c":  # three phases (server/hccl/world.py)
            comm.world.run(op, tasks)
            return
        if comm.world is not None and len(tasks) == 1:  # a send/recv with another host
            comm.world.transfer(op, tasks[0])
            return
        calls = [task.call for task in tasks]
        call = calls[0]
        kind, itemsize = call.kind, ht.ITEM_SIZES.get(call.dtype, 1)
        if kind in ht.POINT_TO_POINT:
            sender = calls[0] if calls[0].kind == ht.HCCL_CMD_SEND else calls[1]
            receiver = calls[1] if sender is calls[0] else calls[0]
            sends, recvs = [sender.send], [receiver.recv]
        elif kind == ht.HCCL_CMD_BROADCAST:
            sends = recvs = [c.send for c in calls]
        else:
            sends, recvs = [c.send for c in calls], [c.recv for c in calls]
        groups = reduce_plan.plan(kind, sends, recvs, call.elements, call.root, itemsize)
        if not groups:  # a barrier, count 0, a broadcast to no one
            for task in tasks:
                self._finish(task)
            return
        self.run_groups(comm, op, tasks, groups)

    def run_groups(
        self, comm: Communicator, op: Op, tasks: list, groups: list, on_done: Callable | None = None
    ) -> None:
        """The data movement of `groups` (server/hccl/reduce_plan.py's form) on the AI cores of the
        tasks' devices: the tasks complete when the last piece has reported, or, for a
        phase of a collective across hosts, `on_done(failure or None)` is called."""
        call = tasks[0].call
        itemsize = ht.ITEM_SIZES.get(call.dtype, 1)
        snapshot = reduce_plan.needs_snapshot(groups, itemsize)
        devices = sorted({task.stream.device for task in tasks})
        cores = [core for d in devices for core in self.devices[d].units[UnitKind.AI_CORE]]
        parallel = min(len(cores), self._cpus)
        pieces = (
            1
            if snapshot
            else reduce_plan.piece_count(reduce_plan.bytes_written(groups, itemsize), parallel)
        )
        job = Job(
            self,
            comm,
            op,
            tasks,
            call,
            groups,
            snapshot,
            reduce_plan.split(groups, pieces),
            cores,
            parallel,
        )
        job.on_done = on_done
        self.jobs.append(job)

    def finish_world_op(
        self,
        comm: Communicator,
        op: Op,
        tasks: list,
        failure: str | None,
        outcome: tuple = REMOTE,
    ) -> None:
        """A collective across hosts ended: its local ranks' tasks complete (or fail with
        `outcome` and `failure`)."""
        for task in tasks:
            if failure is None:
                self._finish(task)
            else:
                self._finish(
                    task, outcome, f"{task.call.describe()} ({comm.title(op.key)}): {failure}"
                )

    def break_communicator(self, comm: Communicator, message: str) -> None:
        """`comm` is broken for good: every collective pending or to come on it fails."""
        if comm.broken is not None:
            return
        comm.broken = (REMOTE, message)
        for op in list(comm.ops.values()):
            self._op_done(comm, op)
            for task in list(op.arrivals.values()):
                self._finish(
                    task, REMOTE, f"{task.call.describe()} ({comm.title(op.key)}): {message}"
                )
        comm.failed.clear()

    def dispatch(self) -> None:
        """Hand the next pieces of waiting jobs to idle AI cores of their devices, one piece
        per core and at most `parallel` cores per job at a time (before kernels)."""
        for job in list(self.jobs):
            if self.scheduler.holds(job):  # a rank's client exports memory now
                continue
            for core in job.cores:
                if job.next_piece == len(job.pieces) or job.out >= job.parallel:
                    break
                if not core.ready or core.inflight:
                    continue
                run = job.pieces[job.next_piece]
                job.next_piece += 1
                job.out += 1
                dtype_name = ht.DTYPE_NAMES.get(job.call.dtype, "uint8")
                token = self.scheduler.hand(core, job)
                piece = ReducePiece.pack(
                    token, dtype_name, job.call.op, job.groups, job.snapshot, run
                )
                self.scheduler.send(core, [piece])
            if job.next_piece == len(job.pieces) and job in self.jobs:
                self.jobs.remove(job)

    def work_done(self, job: Job) -> None:
        """A core finished (or lost) its share of `job`."""
        job.out -= 1
        if job.out or job.next_piece < len(job.pieces):
            return
        failure = job.failure
        if job.on_done is not None:
            job.on_done(failure)
            return
        for task in job.tasks:
            if failure is None:
                self._finish(task, end_ns=job.timestamp)
            else:
                self._finish(
                    task,
                    (failure.code, ht.HCCL_E_INTERNAL),
                    f"{job.call.describe()} ({job.comm.title(job.op.key)}) failed: "
                    f"{failure.message}",
                    end_ns=job.timestamp,
                )

    # ---- deadlines (HCCL_EXEC_TIMEOUT) ----------------------------------------------------------
    def _watch_deadline(self, comm: Communicator, op: Op) -> None:
        if comm.exec_timeout_s <= 0:
            return
        op.deadline = time.monotonic() + comm.exec_timeout_s
        heapq.heappush(self._heap, (op.deadline, next(self._heap_ids), comm, op))
        self.scheduler.note_deadline(op.deadline)  # its thread may sleep until a later one
        self._live += 1
        if len(self._heap) > 64 + 4 * self._live:  # drop entries of ops that finished long ago
            self._heap = [entry for entry in self._heap if not entry[3].done]
            heapq.heapify(self._heap)
        self._refresh_deadline()

    def _refresh_deadline(self) -> None:
        heap = self._heap
        while heap and heap[0][3].done:
            heapq.heappop(heap)
        self.deadline = heap[0][0] if heap else None

    def expire(self, now: float) -> None:
        """Fail every op that has waited past its communicator's HCCL_EXEC_TIMEOUT."""
        while self._heap and self._heap[0][0] <= now:
            _, _, comm, op = heapq.heappop(self._heap)
            if not op.done:
                self._time_out(comm, op)
        self._refresh_deadline()

    def _time_out(self, comm: Communicator, op: Op) -> None:
        missing = [r for r in op.ranks if r not in op.arrivals]
        call = next(iter(op.arrivals.values())).call
        notes = []
        for rank in missing:
            member = comm.members[rank]
            elsewhere = [
                (other.key, other.arrivals[rank].call)
                for other in comm.ops.values()
                if rank in other.arrivals
            ]
            if elsewhere:
                key, what = elsewhere[0]
                notes.append(
                    f"{member.describe()} is waiting at {what.describe()} ({comm.title(key)})"
                )
        message = (
            f"HCCL_E_TIMEOUT: {call.describe()} ({comm.title(op.key)}) waited "
            f"{comm.exec_timeout_s:g} s (HCCL_EXEC_TIMEOUT of the root info's process): "
            f"{rank_list(missing)} never arrived; {rank_list(op.arrivals)} were waiting"
        )
        if notes:
            message += ". " + "; ".join(notes)
        self._fail_op(comm, op, TIMEOUT, message)

    # ---- ranks that leave -----------------------------------------------------------------------
    def leave(self, member: Member) -> None:
        """HcclCommDestroy: what the rank submitted still runs; the others' collectives that
        it will never join fail (now, or when they arrive)."""
        comm = member.comm
        if comm is None or comm.broken is not None:
            return
        if comm.world is not None and all(
            m.state in ("destroyed", "gone") for m in comm.local_members()
        ):
            self.worlds.communicator_done(comm)
        for op in list(comm.ops.values()):
            if (
                member.rank in op.ranks
                and member.rank not in op.arrivals
                and member.never_reaches(op.key)
            ):
                self._fail_op(
                    comm,
                    op,
                    REMOTE,
                    f"{comm.title(op.key)} cannot run: "
                    f"{member.describe()} destroyed the communicator before "
                    "submitting it",
                )

    def withdraw(self, task: CollectiveTask, why: str) -> bool:
        """`task` waits for its peers (not matched yet) and is ended (aclmdlRIAbort of its
        replay): it completes at once; the others fail as if it had been dropped (now, or
        when they arrive). False if it is not waiting (its data movement may be running)."""
        member, key = task.member, task.key
        comm = member.comm
        if comm is None or key is None:
            return False
        op = comm.ops.get(key)
        if op is None or op.arrivals.get(member.rank) is not task:
            return False
        del op.arrivals[member.rank]
        self._fail_op(
            comm,
            op,
            REMOTE,
            f"{comm.title(key)} cannot run: {member.describe()} {why} its "
            f"{task.call.describe()} while it waited for the other ranks",
        )
        failed = comm.failed.get(key)
        if failed is not None:  # this rank never comes back to it
            failed[2].discard(member.rank)
            if not failed[2]:
                del comm.failed[key]
        self._finish(task)
        return True

    def discarded(self, task: CollectiveTask) -> None:
        """A collective task was dropped before it reached its stream's head (the stream was
        force-destroyed, its context stopped on failure, its process ended, its replay
        aborted); one that took no place (a recorded one) leaves nothing to fail."""
        member, key, call = task.member, task.key, task.call
        comm = member.comm
        if comm is None or comm.broken is not None or key is None:
            return
        message = (
            f"{comm.title(key)} cannot run: {member.describe()} dropped its {call.describe()} "
            "before it ran (its stream was destroyed or stopped on an earlier failure, or its "
            "replay was aborted)"
        )
        op = comm.ops.get(key)
        if op is not None:
            self._fail_op(comm, op, REMOTE, message)
        else:
            ranks = comm.ranks_of(key)
            comm.failed[key] = (REMOTE, message, {r for r in ranks if r != member.rank})
            if comm.world is not None:
                self.worlds.break_world(comm.world, f"on {comm.world.here()}: {message}")

    def session_closed(self, session) -> None:
        """The session ended (exit, crash, SIGKILL): each of its ranks is gone; its
        communicators are broken and every collective pending or to come on them fails."""
        for member, was in self.communicators.session_closed(session):
            comm = member.comm
            if comm.broken is not None:
                continue
            if was == "destroyed" and not any(
                member.rank in op.arrivals for op in comm.ops.values()
            ):
                continue  # it left cleanly earlier; what it never submitted fails as it arrives
            message = (
                f"{member.describe()} ended (its process exited or was killed): "
                f"communicator {comm.id} is broken; destroy it and create a new one"
            )
            if comm.world is not None:
                self.worlds.break_world(comm.world, f"on {comm.world.here()}: {message}")
            else:
                self.break_communicator(comm, message)
