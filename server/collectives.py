"""HCCL communicators in the daemon: root infos, the init rendezvous, matching the ranks'
collectives, running them, and failing them clearly.

- Root info: the daemon issues a communicator id to the root rank's process and records
  that process's HCCL_EXEC_TIMEOUT; the 4108 bytes carry the id and the daemon's identity.
- Init: each rank's HcclCommInitRootInfo is a deferred request; the reply goes out when
  every rank has joined, or with HCCL_E_TIMEOUT (naming the missing ranks) when a rank's
  HCCL_CONNECT_TIMEOUT passes first. Bad n_ranks / rank / reuse -> HCCL_E_PARA.
- Collectives are tasks on the ranks' streams. When one reaches the head of its stream the
  scheduler calls `arrive`: the task waits under its key -- ("c", k) for the rank's k-th
  collective on the communicator, ("p", src, dst, j) for the j-th send/recv of a pair --
  until every rank taking part has arrived. A rank that arrives with a different call
  fails the key at once on every rank, the message naming each rank and what it called.
  When all match, the data movement is planned (server/reduce.py) and handed to the AI
  cores of the ranks' devices; every rank's task completes when the last piece does.
- Failures are task failures, reported at the next synchronize with an ACL code (and kept
  for HcclGetCommAsyncError as an HcclResult): mismatch 107000 / HCCL_E_PARA, waiting
  longer than HCCL_EXEC_TIMEOUT 107020 / HCCL_E_TIMEOUT, a rank whose process ended (or
  that destroyed the communicator, or dropped its task) 507904 / HCCL_E_REMOTE.

Request handlers run on a session's reader thread and only check arguments; everything
else runs on the scheduler thread, which owns all the state here.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from simnpu.proto import codes, npu_pb2
from simnpu.proto import hccl_types as ht
from simnpu.proto.errors import NpuError, bad_handle, invalid
from simnpu.server import reduce
from simnpu.server.objects import COLLECTIVE_WORK, DISPATCHED, Failure, Waiter

log = logging.getLogger("simnpu.collectives")

ROOT_MAGIC = b"simnpu-hccl-root"
ROOT_VERSION = 1
ROOT_LAYOUT = struct.Struct("<16sIQI16sI")  # magic, version, comm id, daemon pid, daemon nonce, root device
COMM_HANDLE_KIND = 16
MAX_RANKS = 4096

# (ACL code at synchronize, HcclResult for HcclGetCommAsyncError)
MISMATCH = (codes.ACL_ERROR_RT_PARAM_INVALID, ht.HCCL_E_PARA)
TIMEOUT = (codes.ACL_ERROR_RT_TASK_TIMEOUT, ht.HCCL_E_TIMEOUT)
REMOTE = (codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL, ht.HCCL_E_REMOTE)


class HcclFailure(Exception):
    """A request that fails with an HcclResult (the reply's code)."""

    def __init__(self, result: int, message: str):
        super().__init__(message)
        self.result = result
        self.message = message


# ---- what a rank called --------------------------------------------------------------------------
class Call(NamedTuple):
    kind: int
    count: int        # the call's own count: sendCount (all_gather), recvCount (reduce_scatter), ...
    dtype: int
    op: int
    root: int         # root (broadcast, reduce) or peer (send, recv)
    send: tuple       # (device, offset)
    recv: tuple
    recv_count: int
    recv_dtype: int

    def signature(self) -> tuple:
        """What must be equal on every rank (send and recv of a pair compare count and type)."""
        kind = self.kind
        if kind in ht.POINT_TO_POINT:
            return (self.count, self.dtype)
        if kind == ht.HCCL_CMD_BARRIER:
            return (kind,)
        return (kind, self.count, self.dtype, self.op if kind in ht.REDUCING else None,
                self.root if kind in ht.ROOTED else None,
                (self.recv_count, self.recv_dtype) if kind == ht.HCCL_CMD_ALLTOALL else None)

    def describe(self) -> str:
        kind, name = self.kind, ht.COLLECTIVE_NAMES.get(self.kind, f"collective {self.kind}")
        dtype = ht.SHORT_DTYPE_NAMES.get(self.dtype, str(self.dtype))
        if kind == ht.HCCL_CMD_BARRIER:
            return "barrier()"
        if kind == ht.HCCL_CMD_SEND:
            return f"send(count={self.count}, {dtype}, to rank {self.root})"
        if kind == ht.HCCL_CMD_RECEIVE:
            return f"recv(count={self.count}, {dtype}, from rank {self.root})"
        if kind == ht.HCCL_CMD_ALLTOALL:
            recv_dtype = ht.SHORT_DTYPE_NAMES.get(self.recv_dtype, str(self.recv_dtype))
            return f"alltoall(send_count={self.count}, {dtype}, recv_count={self.recv_count}, {recv_dtype})"
        label = {ht.HCCL_CMD_ALLGATHER: "send_count", ht.HCCL_CMD_REDUCE_SCATTER: "recv_count",
                 ht.HCCL_CMD_SCATTER: "recv_count"}.get(kind, "count")
        parts = [f"{label}={self.count}", dtype]
        if kind in ht.REDUCING:
            parts.append(ht.REDUCE_OP_NAMES.get(self.op, str(self.op)))
        if kind in ht.ROOTED:
            parts.append(f"root={self.root}")
        return f"{name}({', '.join(parts)})"


# ---- state ------------------------------------------------------------------------------------
@dataclass(eq=False)
class Member:
    """One rank of a communicator: what the handle in the rank's session stands for."""

    session: object
    rank: int
    n_ranks: int
    device: int
    comm_id: int
    handle: int = 0
    comm: "Communicator | None" = None  # set once every rank has joined
    state: str = "joining"               # joining -> ready -> destroyed | gone
    collectives: int = 0                 # collectives submitted (session reader thread)
    sends: dict = field(default_factory=dict)  # peer -> sends submitted (reader thread)
    recvs: dict = field(default_factory=dict)  # peer -> recvs submitted (reader thread)
    error: tuple | None = None           # (HcclResult, message): HcclGetCommAsyncError

    def describe(self) -> str:
        return f"rank {self.rank} (pid {getattr(self.session, 'pid', '?')}, device {self.device})"

    def never_reaches(self, key: tuple) -> bool:
        """After destroy: True if this rank submitted nothing under `key` before it left."""
        if key[0] == "c":
            return key[1] >= self.collectives
        _, src, dst, index = key
        return index >= (self.sends.get(dst, 0) if self.rank == src else self.recvs.get(src, 0))


@dataclass(eq=False)
class Rendezvous:
    comm_id: int
    exec_timeout_s: float
    root_pid: int
    root_device: int
    n_ranks: int | None = None
    joined: dict = field(default_factory=dict)  # rank -> (member, waiter, request id)
    state: str = "open"                          # open -> formed | failed
    outcome: tuple | None = None                 # failed: (HcclResult, message)


@dataclass(eq=False)
class Op:
    """Collective `key` of a communicator, arrived at by some of its ranks."""

    key: tuple
    ranks: tuple                                  # the ranks taking part
    arrivals: dict = field(default_factory=dict)  # rank -> task
    deadline: float | None = None
    done: bool = False


@dataclass(eq=False)
class Communicator:
    id: int
    members: list                                # Member by rank
    exec_timeout_s: float
    ops: dict = field(default_factory=dict)      # key -> Op waiting for ranks
    failed: dict = field(default_factory=dict)   # key -> (codes, message, ranks yet to arrive)
    broken: tuple | None = None                  # (codes, message): a rank is gone for good

    @property
    def n_ranks(self) -> int:
        return len(self.members)


@dataclass(eq=False)
class Job:
    """The data movement of one matched collective: what the scheduler hands AI cores.
    Shaped like a task for the scheduler's result path (kind, stream, seq, failure, timestamp)."""

    comm: Communicator
    op: Op
    tasks: list
    call: Call
    groups: list
    snapshot: bool
    pieces: list
    cores: list
    kind: str = COLLECTIVE_WORK
    payload: tuple = ()
    failure: Failure | None = None
    timestamp: int = 0
    next_piece: int = 0
    out: int = 0

    @property
    def stream(self):
        return self.tasks[0].stream

    @property
    def seq(self) -> int:
        return self.tasks[0].seq


def _rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _op_title(comm: Communicator, key: tuple) -> str:
    if key[0] == "c":
        return f"collective #{key[1]} on communicator {comm.id}"
    return f"send/recv #{key[3]} from rank {key[1]} to rank {key[2]} on communicator {comm.id}"


class Collectives:
    """Every communicator of the daemon. Owned by the scheduler (scheduler thread)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.pid = os.getpid()
        self.nonce = os.urandom(16)
        self._ids = itertools.count(1)
        self.rendezvous: dict[int, Rendezvous] = {}
        self.jobs: list[Job] = []
        self.deadline: float | None = None  # the earliest exec-timeout deadline of a waiting op
        self._heap: list = []
        self._heap_ids = itertools.count()
        self._live = 0
        self._members: dict = {}  # session -> [Member]
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        # cores one collective's data movement spreads over: more than the host's CPUs only adds wake-ups
        self._cpus = max(1, int(os.environ.get("SIMNPU_HCCL_MAX_CORES", cpus)))

    # ==== requests (session reader thread) ===========================================================
    def handlers(self, session) -> dict:
        """The session's handlers of the HCCL request ops."""

        def wrap(method):
            def handler(request):
                try:
                    method(session, request)
                except HcclFailure as failure:
                    session.respond(request.id, failure.result, failure.message)
                except NpuError as error:  # a bad handle or argument: HCCL says E_PARA
                    session.respond(request.id, ht.HCCL_E_PARA, error.message)
                from simnpu.server.session import DEFERRED

                return DEFERRED
            return handler

        return {
            npu_pb2.OP_HCCL_GET_ROOT_INFO: wrap(self._get_root_info),
            npu_pb2.OP_HCCL_COMM_INIT: wrap(self._comm_init),
            npu_pb2.OP_HCCL_COMM_DESTROY: wrap(self._comm_destroy),
            npu_pb2.OP_HCCL_COMM_ASYNC_ERROR: wrap(self._comm_async_error),
        }

    def _get_root_info(self, session, request) -> None:
        device, exec_timeout_ms = (list(request.args) + [0, -1])[:2]
        session._device(device)
        timeout_s = ht.DEFAULT_EXEC_TIMEOUT_S if exec_timeout_ms < 0 else exec_timeout_ms / 1000.0

        def issue():
            comm_id = next(self._ids)
            self.rendezvous[comm_id] = Rendezvous(comm_id, timeout_s, session.pid, device)
            info = ROOT_LAYOUT.pack(ROOT_MAGIC, ROOT_VERSION, comm_id, self.pid, self.nonce, device)
            session.respond(request.id, data=info.ljust(ht.HCCL_ROOT_INFO_BYTES, b"\0"))

        session._batch.append((issue, ()))

    def _parse_root_info(self, data: bytes) -> int:
        if len(data) != ht.HCCL_ROOT_INFO_BYTES or not data.startswith(ROOT_MAGIC):
            raise HcclFailure(ht.HCCL_E_PARA, f"not a simnpu HCCL root info ({len(data)} bytes; "
                                              f"expected {ht.HCCL_ROOT_INFO_BYTES} from get_root_info)")
        _, version, comm_id, pid, nonce, _ = ROOT_LAYOUT.unpack_from(data)
        if version != ROOT_VERSION or nonce != self.nonce:
            raise HcclFailure(ht.HCCL_E_PARA, f"the root info was issued by another simnpu daemon (pid {pid}), "
                                              f"not this one (pid {self.pid})")
        return comm_id

    def _comm_init(self, session, request) -> None:
        n_ranks, rank, device, connect_timeout_ms = (list(request.args) + [0, 0, 0, 0])[:4]
        comm_id = self._parse_root_info(request.data)
        session._device(device)
        if not 1 <= n_ranks <= MAX_RANKS:
            raise HcclFailure(ht.HCCL_E_PARA, f"n_ranks {n_ranks} is not in [1, {MAX_RANKS}]")
        if not 0 <= rank < n_ranks:
            raise HcclFailure(ht.HCCL_E_PARA, f"rank {rank} is not in [0, n_ranks={n_ranks})")
        if connect_timeout_ms <= 0:
            connect_timeout_ms = int(ht.DEFAULT_CONNECT_TIMEOUT_S * 1000)
        member = Member(session, rank, n_ranks, device, comm_id)
        member.handle = session._new_handle(member, COMM_HANDLE_KIND)
        session._batch.append((self._join, (member, connect_timeout_ms / 1000.0, request.id)))

    def _comm_destroy(self, session, request) -> None:
        member = self.member(session, request.args[0] if request.args else 0)
        del session.handles[member.handle]

        def leave():
            self._leave(member)
            session.respond(request.id)

        session._batch.append((leave, ()))

    def _comm_async_error(self, session, request) -> None:
        member = self.member(session, request.args[0] if request.args else 0)

        def answer():
            result, message = member.error or (ht.HCCL_SUCCESS, "")
            session.respond(request.id, values=[result], text=message)

        session._batch.append((answer, ()))

    @staticmethod
    def member(session, handle: int) -> Member:
        member = session.handles.get(handle)
        if not isinstance(member, Member) or member.comm is None:
            raise bad_handle("communicator", handle)
        return member

    # ==== asynchronous collectives (session reader thread) ===========================================
    def payload(self, session, command) -> tuple:
        """Check one collective command of `session`; the payload of its task:
        (member, key, Call). Raises NpuError (a rejected asynchronous call)."""
        member = self.member(session, command.comm)
        stream = session._stream(command.stream)
        if stream.device != member.device:
            raise invalid(f"the stream is on device {stream.device} but rank {member.rank} of the "
                          f"communicator is on device {member.device}")
        kind, count, dtype, n, rank = command.kind, command.count, command.dtype, member.n_ranks, member.rank
        if kind not in ht.COLLECTIVE_NAMES:
            raise invalid(f"unknown collective {kind}")
        if kind != ht.HCCL_CMD_BARRIER and dtype not in ht.ITEM_SIZES:
            raise NpuError(codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                           f"HCCL data type {dtype} is not supported by the simulated NPU")
        if kind in ht.REDUCING and command.op not in ht.REDUCE_OP_NAMES:
            raise invalid(f"unknown reduce op {command.op}")
        if kind in ht.ROOTED + ht.POINT_TO_POINT and not 0 <= command.root < n:
            raise invalid(f"rank {command.root} is not in [0, {n})")
        if kind in ht.POINT_TO_POINT and command.root == rank:
            raise invalid(f"rank {rank} cannot send to or receive from itself")
        if kind == ht.HCCL_CMD_ALLTOALL and (command.recv_count, command.recv_dtype) != (count, dtype):
            raise invalid("alltoall needs recv_count == send_count and recv_type == send_type")
        size = ht.ITEM_SIZES.get(dtype, 0) * count
        send_bytes, recv_bytes = {
            ht.HCCL_CMD_ALLREDUCE: (size, size),
            ht.HCCL_CMD_REDUCE: (size, size if rank == command.root else 0),
            ht.HCCL_CMD_BROADCAST: (size, 0),
            ht.HCCL_CMD_ALLGATHER: (size, size * n),
            ht.HCCL_CMD_REDUCE_SCATTER: (size * n, size),
            ht.HCCL_CMD_ALLTOALL: (size * n, size * n),
            ht.HCCL_CMD_SCATTER: (size * n if rank == command.root else 0, size),
            ht.HCCL_CMD_SEND: (size, 0),
            ht.HCCL_CMD_RECEIVE: (0, size),
            ht.HCCL_CMD_BARRIER: (0, 0),
        }[kind]
        send = self._location(session, member, command.send, send_bytes, "send")
        recv = self._location(session, member, command.recv, recv_bytes, "recv")
        call = Call(kind, count, dtype, command.op, command.root, send, recv, command.recv_count,
                    command.recv_dtype)
        if kind == ht.HCCL_CMD_SEND:
            index = member.sends.get(command.root, 0)
            member.sends[command.root] = index + 1
            key: tuple = ("p", rank, command.root, index)
        elif kind == ht.HCCL_CMD_RECEIVE:
            index = member.recvs.get(command.root, 0)
            member.recvs[command.root] = index + 1
            key = ("p", command.root, rank, index)
        else:
            key = ("c", member.collectives)
            member.collectives += 1
        return (member, key, call)

    @staticmethod
    def _location(session, member: Member, address: int, nbytes: int, what: str) -> tuple:
        if nbytes == 0:
            return (member.device, 0)
        device, offset = session._device_range(address, nbytes)
        if device.index != member.device:
            raise invalid(f"the {what} buffer {address:#x} is on device {device.index} but rank "
                          f"{member.rank} of the communicator is on device {member.device}")
        return (device.index, offset)

    # ==== init (scheduler thread) =======================================================================
    def _join(self, member: Member, connect_timeout_s: float, request_id: int) -> None:
        session = member.session
        self._members.setdefault(session, []).append(member)
        rendezvous = self.rendezvous.get(member.comm_id)
        problem = None
        if rendezvous is None:
            problem = (ht.HCCL_E_PARA, f"communicator id {member.comm_id} is unknown to this daemon")
        elif rendezvous.state == "formed":
            problem = (ht.HCCL_E_PARA, f"this root info already formed communicator {member.comm_id}: "
                                       "call get_root_info for a new one")
        elif rendezvous.state == "failed":
            problem = rendezvous.outcome
        elif rendezvous.n_ranks is not None and rendezvous.n_ranks != member.n_ranks:
            others = ", ".join(f"{m.describe()} passed n_ranks={m.n_ranks}"
                               for m, _, _ in rendezvous.joined.values())
            problem = (ht.HCCL_E_PARA, f"{member.describe()} passed n_ranks={member.n_ranks} but {others}")
        elif member.rank in rendezvous.joined:
            holder = rendezvous.joined[member.rank][0]
            problem = (ht.HCCL_E_PARA, f"rank {member.rank} of communicator {member.comm_id} was already "
                                       f"joined by pid {holder.session.pid} (device {holder.device}); "
                                       f"pid {session.pid} asked for it again")
        if problem is not None:
            self._reject(member, request_id, *problem)
            return
        rendezvous.n_ranks = member.n_ranks

        def finish(timed_out: bool) -> None:
            if timed_out and rendezvous.state == "open":
                missing = sorted(set(range(rendezvous.n_ranks)) - set(rendezvous.joined))
                self._fail_rendezvous(rendezvous, ht.HCCL_E_TIMEOUT, (
                    f"communicator {rendezvous.comm_id} init timed out after {connect_timeout_s:g} s "
                    f"(HCCL_CONNECT_TIMEOUT of {member.describe()}): {_rank_list(missing)} of "
                    f"{rendezvous.n_ranks} never joined"))

        waiter = Waiter(lambda: False, finish, time.monotonic() + connect_timeout_s)
        rendezvous.joined[member.rank] = (member, waiter, request_id)
        if len(rendezvous.joined) == rendezvous.n_ranks:
            self._form(rendezvous)
        else:
            self.scheduler.watch(waiter)

    def _reject(self, member: Member, request_id: int, result: int, message: str) -> None:
        member.state = "gone"
        member.session.handles.pop(member.handle, None)
        member.session.respond(request_id, result, message)

    def _form(self, rendezvous: Rendezvous) -> None:
        members = [rendezvous.joined[rank][0] for rank in range(rendezvous.n_ranks)]
        comm = Communicator(rendezvous.comm_id, members, rendezvous.exec_timeout_s)
        devices = [m.device for m in members]
        if len(set(devices)) < len(devices):
            log.info("communicator %d: several ranks share a device (%s), a simnpu extension",
                     comm.id, devices)
        for member, waiter, request_id in rendezvous.joined.values():
            waiter.finished = True
            member.comm = comm
            member.state = "ready"
            member.session.respond(request_id, values=[member.handle])
        rendezvous.state = "formed"
        rendezvous.joined = {}

    def _fail_rendezvous(self, rendezvous: Rendezvous, result: int, message: str) -> None:
        rendezvous.state = "failed"
        rendezvous.outcome = (result, message)
        joined, rendezvous.joined = rendezvous.joined, {}
        for member, waiter, request_id in joined.values():
            waiter.finished = True
            self._reject(member, request_id, result, message)

    # ==== collectives (scheduler thread) ================================================================
    def arrive(self, task) -> None:
        """A collective task reached the head of its stream: wait for its peers, run it when
        all have come, or fail it (the task is DONE on return only if it failed at once)."""
        member, key, call = task.payload
        comm = member.comm
        task.state = DISPATCHED
        if comm.broken is not None:
            self._finish(task, comm.broken[0], f"{call.describe()} ({_op_title(comm, key)}): {comm.broken[1]}")
            return
        failed = comm.failed.get(key)
        if failed is not None:
            outcome, message, to_come = failed
            to_come.discard(member.rank)
            if not to_come:
                del comm.failed[key]
            self._finish(task, outcome, f"{message}\n(rank {member.rank} arrived later with {call.describe()})")
            return
        op = comm.ops.get(key)
        if op is None:
            ranks = tuple(range(comm.n_ranks)) if key[0] == "c" else (key[1], key[2])
            op = comm.ops[key] = Op(key, ranks)
            self._watch_deadline(comm, op)
        op.arrivals[member.rank] = task
        if not self._matches(comm, op):
            return
        gone = [r for r in op.ranks if r not in op.arrivals
                and comm.members[r].state == "destroyed" and comm.members[r].never_reaches(key)]
        if gone:
            self._fail_op(comm, op, REMOTE, f"{_op_title(comm, key)} cannot run: "
                          + "; ".join(f"{comm.members[r].describe()} destroyed the communicator before "
                                      "submitting it" for r in gone))
            return
        if len(op.arrivals) == len(op.ranks):
            self._op_done(comm, op)
            self._execute(comm, op)

    def _matches(self, comm: Communicator, op: Op) -> bool:
        """False (and the op failed on every rank that arrived) if the calls differ."""
        calls = {rank: task.payload[2] for rank, task in op.arrivals.items()}
        if len({call.signature() for call in calls.values()}) == 1:
            if op.key[0] == "c" or len(calls) < 2:
                return True
            send, recv = calls[op.key[1]], calls[op.key[2]]
            if send.kind == ht.HCCL_CMD_SEND and recv.kind == ht.HCCL_CMD_RECEIVE:
                return True
        called = "; ".join(f"{comm.members[rank].describe()} called {calls[rank].describe()}"
                           for rank in sorted(calls))
        missing = [r for r in op.ranks if r not in calls]
        later = f"; {_rank_list(missing)} had not reached it yet" if missing else ""
        self._fail_op(comm, op, MISMATCH,
                      f"HCCL mismatch at {_op_title(comm, op.key)}: {called}{later}")
        return False

    def _fail_op(self, comm: Communicator, op: Op, outcome: tuple, message: str) -> None:
        """Fail every rank waiting in `op`; ranks that arrive at its key later fail too."""
        self._op_done(comm, op)
        to_come = {r for r in op.ranks if r not in op.arrivals}
        if to_come:
            comm.failed[op.key] = (outcome, message, to_come)
        for task in list(op.arrivals.values()):
            self._finish(task, outcome, message)

    def _op_done(self, comm: Communicator, op: Op) -> None:
        comm.ops.pop(op.key, None)
        if not op.done:
            op.done = True
            if op.deadline is not None:
                self._live -= 1
                self._refresh_deadline()

    def _finish(self, task, outcome: tuple | None = None, message: str = "", end_ns: int | None = None) -> None:
        """Complete one rank's collective task (failed if `outcome` is given)."""
        end = end_ns if end_ns is not None else time.monotonic_ns()
        task.timestamp = end
        stream = task.stream
        stream.clock = max(stream.clock, end)
        if outcome is not None:
            task.failure = Failure(outcome[0], message, task.seq)
            member = task.payload[0]
            if member.error is None:
                member.error = (outcome[1], message)
        self.scheduler._complete(task)

    # ---- execution ------------------------------------------------------------------------------------
    def _execute(self, comm: Communicator, op: Op) -> None:
        tasks = [op.arrivals[rank] for rank in op.ranks]
        calls = [task.payload[2] for task in tasks]
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
        groups = reduce.plan(kind, sends, recvs, call.count, call.root, itemsize)
        if not groups:  # a barrier, count 0, a broadcast to no one
            for task in tasks:
                self._finish(task)
            return
        snapshot = reduce.needs_snapshot(groups, itemsize)
        devices = sorted({task.stream.device for task in tasks})
        cores = [core for d in devices for core in self.scheduler.devices[d].cores]
        parallel = min(len(cores), self._cpus)
        pieces = 1 if snapshot else reduce.piece_count(reduce.bytes_written(groups, itemsize), parallel)
        job = Job(comm, op, tasks, call, groups, snapshot, reduce.split(groups, pieces), cores)
        self.jobs.append(job)

    def dispatch(self) -> None:
        """Hand pieces of waiting jobs to idle AI cores of their devices (before kernels)."""
        for job in list(self.jobs):
            idle = [core for core in job.cores if core.idle]
            remaining = len(job.pieces) - job.next_piece
            share = -(-remaining // max(1, len(idle)))
            for core in idle:
                if job.next_piece == len(job.pieces):
                    break
                run = [part for piece in job.pieces[job.next_piece:job.next_piece + share] for part in piece]
                job.next_piece = min(len(job.pieces), job.next_piece + share)
                job.out += 1
                dtype_name = ht.DTYPE_NAMES.get(job.call.dtype, "uint8")
                self.scheduler.send_work(core, job, "collective", dtype_name, job.call.op, job.groups,
                                         job.snapshot, run)
            if job.next_piece == len(job.pieces) and job in self.jobs:
                self.jobs.remove(job)

    def work_done(self, job: Job) -> None:
        """A core finished (or lost) its share of `job` (the scheduler set failure/timestamp)."""
        job.out -= 1
        if job.out or job.next_piece < len(job.pieces):
            return
        failure = job.failure
        for task in job.tasks:
            if failure is None:
                self._finish(task, end_ns=job.timestamp)
            else:
                self._finish(task, (failure.code, ht.HCCL_E_INTERNAL),
                             f"{job.call.describe()} ({_op_title(job.comm, job.op.key)}) failed: "
                             f"{failure.message}", end_ns=job.timestamp)

    # ---- deadlines (HCCL_EXEC_TIMEOUT) -----------------------------------------------------------------
    def _watch_deadline(self, comm: Communicator, op: Op) -> None:
        if comm.exec_timeout_s <= 0:
            return
        op.deadline = time.monotonic() + comm.exec_timeout_s
        heapq.heappush(self._heap, (op.deadline, next(self._heap_ids), comm, op))
        note = getattr(self.scheduler, "_note_deadline", None)
        if note is not None:  # the scheduler thread may be asleep until a later deadline
            note(op.deadline)
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
        call = next(iter(op.arrivals.values())).payload[2]
        notes = []
        for rank in missing:
            member = comm.members[rank]
            elsewhere = [(other.key, other.arrivals[rank].payload[2]) for other in comm.ops.values()
                         if rank in other.arrivals]
            if elsewhere:
                key, what = elsewhere[0]
                notes.append(f"{member.describe()} is waiting at {what.describe()} ({_op_title(comm, key)})")
        message = (f"HCCL_E_TIMEOUT: {call.describe()} ({_op_title(comm, op.key)}) waited "
                   f"{comm.exec_timeout_s:g} s (HCCL_EXEC_TIMEOUT of the root info's process): "
                   f"{_rank_list(missing)} never arrived; {_rank_list(op.arrivals)} were waiting")
        if notes:
            message += ". " + "; ".join(notes)
        self._fail_op(comm, op, TIMEOUT, message)

    # ---- ranks that leave -----------------------------------------------------------------------------
    def _leave(self, member: Member) -> None:
        """HcclCommDestroy: what the rank submitted still runs; the others' collectives that
        it will never join fail (now, or when they arrive)."""
        comm = member.comm
        member.state = "destroyed"
        if comm is None or comm.broken is not None:
            return
        for op in list(comm.ops.values()):
            if member.rank in op.ranks and member.rank not in op.arrivals and member.never_reaches(op.key):
                self._fail_op(comm, op, REMOTE, f"{_op_title(comm, op.key)} cannot run: "
                                                f"{member.describe()} destroyed the communicator before "
                                                "submitting it")

    def discarded(self, task) -> None:
        """A collective task was dropped before it reached its stream's head (the stream was
        force-destroyed, its context stopped on failure, its process ended)."""
        member, key, call = task.payload
        comm = member.comm
        if comm is None or comm.broken is not None:
            return
        message = (f"{_op_title(comm, key)} cannot run: {member.describe()} dropped its {call.describe()} "
                   "before it ran (its stream was destroyed or stopped on an earlier failure)")
        op = comm.ops.get(key)
        if op is not None:
            self._fail_op(comm, op, REMOTE, message)
        else:
            ranks = range(comm.n_ranks) if key[0] == "c" else (key[1], key[2])
            comm.failed[key] = (REMOTE, message, {r for r in ranks if r != member.rank})

    def session_closed(self, session) -> None:
        """The session ended (exit, crash, SIGKILL): each of its ranks is gone; its
        communicators are broken and every collective pending or to come on them fails."""
        for member in self._members.pop(session, []):
            if member.state == "joining":
                rendezvous = self.rendezvous.get(member.comm_id)
                if rendezvous is not None and rendezvous.state == "open" \
                        and rendezvous.joined.get(member.rank, (None,))[0] is member:
                    self._fail_rendezvous(rendezvous, ht.HCCL_E_REMOTE,
                                          f"{member.describe()} ended before every rank joined "
                                          f"communicator {member.comm_id}")
                continue
            was = member.state
            member.state = "gone"
            comm = member.comm
            if comm is None or comm.broken is not None:
                continue
            if was == "destroyed" and not any(member.rank in op.arrivals for op in comm.ops.values()):
                continue  # it left cleanly earlier; what it never submitted fails as it arrives
            comm.broken = (REMOTE, f"{member.describe()} ended (its process exited or was killed): "
                                   f"communicator {comm.id} is broken; destroy it and create a new one")
            for op in list(comm.ops.values()):
                self._op_done(comm, op)
                for task in list(op.arrivals.values()):
                    self._finish(task, comm.broken[0], f"{task.payload[2].describe()} "
                                                       f"({_op_title(comm, op.key)}): {comm.broken[1]}")
            comm.failed.clear()
