"""HCCL communicators: root infos, the init rendezvous, destroy, and the requests that
drive them (HcclGetRootInfo, HcclCommInitRootInfo, HcclCommDestroy, HcclGetCommAsyncError).

- Root info: the daemon issues a communicator id to the root rank's process and records
  that process's HCCL_EXEC_TIMEOUT; the 4108 bytes carry the id and the daemon's identity
  (pid and a random nonce), so root info from another daemon is refused.
- Init: each rank's HcclCommInitRootInfo is a deferred request; the replies go out when
  every rank has joined, or with HCCL_E_TIMEOUT (naming the missing ranks) when a rank's
  HCCL_CONNECT_TIMEOUT passes first. Bad n_ranks / rank / a reused root info ->
  HCCL_E_PARA; a rank whose process ends during init -> HCCL_E_REMOTE for the others.

Request handlers run on a session's reader thread and only check arguments; the rest runs
under the scheduler (its thread, or its lock), which owns all the state here. What runs
on a formed communicator is server/collectives.py.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2
from simnpu.proto.errors import NpuError, bad_handle
from simnpu.server.objects import Waiter
from simnpu.server.sentinels import DEFERRED

log = logging.getLogger("simnpu.collectives")

ROOT_MAGIC = b"simnpu-hccl-root"
ROOT_VERSION = 1
ROOT_LAYOUT = struct.Struct(
    "<16sIQI16sI"
)  # magic, version, comm id, daemon pid, daemon nonce, root device
COMM_HANDLE_KIND = 16
MAX_RANKS = 4096


class HcclFailure(Exception):
    """A request that fails with an HcclResult (the reply's code)."""

    def __init__(self, result: int, message: str):
        super().__init__(message)
        self.result = result
        self.message = message


@dataclass(eq=False)
class Member:
    """One rank of a communicator: what the handle in the rank's session stands for."""

    session: Any  # the Session that joined
    rank: int
    n_ranks: int
    device: int
    comm_id: int
    handle: int = 0
    comm: Communicator | None = None  # set once every rank has joined
    state: str = "joining"  # joining -> ready -> destroyed | gone
    collectives: int = 0  # collectives submitted (session reader thread)
    sends: dict = field(default_factory=dict)  # peer -> sends submitted (reader thread)
    recvs: dict = field(default_factory=dict)  # peer -> recvs submitted (reader thread)
    error: tuple | None = None  # (HcclResult, message): HcclGetCommAsyncError

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
    state: str = "open"  # open -> formed | failed
    outcome: tuple | None = None  # failed: (HcclResult, message)


@dataclass(eq=False)
class Communicator:
    id: int
    members: list  # Member by rank
    exec_timeout_s: float
    ops: dict = field(default_factory=dict)  # key -> Op waiting for ranks
    failed: dict = field(default_factory=dict)  # key -> (codes, message, ranks yet to arrive)
    broken: tuple | None = None  # (codes, message): a rank is gone for good

    @property
    def n_ranks(self) -> int:
        return len(self.members)


def member_of(session, handle: int) -> Member:
    """The formed communicator rank a session's handle stands for (else 107017)."""
    member = session.handles.get(handle)
    if not isinstance(member, Member) or member.comm is None:
        raise bad_handle("communicator", handle)
    return member


def rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class Communicators:
    """Root infos, rendezvous and the ranks of every session (scheduler-owned)."""

    def __init__(self, scheduler, on_leave):
        self.scheduler = scheduler
        self._on_leave = on_leave  # (member) after HcclCommDestroy, for its pending collectives
        self.pid = os.getpid()
        self.nonce = os.urandom(16)
        self._ids = itertools.count(1)
        self.rendezvous: dict[int, Rendezvous] = {}
        self._members: dict = {}  # session -> [Member]

    # ==== requests (session reader thread) =======================================================
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
            session.respond(request.id, data=self.issue_root_info(session.pid, device, timeout_s))

        session._batch.append((issue, ()))

    def issue_root_info(self, root_pid: int, device: int, exec_timeout_s: float) -> bytes:
        """A new communicator id as root info bytes (scheduler): for HcclGetRootInfo, and for
        a job's rendezvous (server/rendezvous.py) on behalf of its rank 0."""
        comm_id = next(self._ids)
        self.rendezvous[comm_id] = Rendezvous(comm_id, exec_timeout_s, root_pid, device)
        info = ROOT_LAYOUT.pack(ROOT_MAGIC, ROOT_VERSION, comm_id, self.pid, self.nonce, device)
        return info.ljust(ht.HCCL_ROOT_INFO_BYTES, b"\0")

    def _parse_root_info(self, data: bytes) -> int:
        if len(data) != ht.HCCL_ROOT_INFO_BYTES or not data.startswith(ROOT_MAGIC):
            raise HcclFailure(
                ht.HCCL_E_PARA,
                f"not a simnpu HCCL root info ({len(data)} bytes; "
                f"expected {ht.HCCL_ROOT_INFO_BYTES} from get_root_info)",
            )
        _, version, comm_id, pid, nonce, _ = ROOT_LAYOUT.unpack_from(data)
        if version != ROOT_VERSION or nonce != self.nonce:
            raise HcclFailure(
                ht.HCCL_E_PARA,
                f"the root info was issued by another simnpu daemon (pid {pid}), "
                f"not this one (pid {self.pid})",
            )
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
        member = member_of(session, request.args[0] if request.args else 0)
        del session.handles[member.handle]

        def leave():
            member.state = "destroyed"
            self._on_leave(member)
            session.respond(request.id)

        session._batch.append((leave, ()))

    def _comm_async_error(self, session, request) -> None:
        member = member_of(session, request.args[0] if request.args else 0)

        def answer():
            result, message = member.error or (ht.HCCL_SUCCESS, "")
            session.respond(request.id, values=[result], text=message)

        session._batch.append((answer, ()))

    # ==== init (scheduler thread) ================================================================
    def _join(self, member: Member, connect_timeout_s: float, request_id: int) -> None:
        session = member.session
        self._members.setdefault(session, []).append(member)
        rendezvous = self.rendezvous.get(member.comm_id)
        problem: tuple | None = None
        if rendezvous is None:
            problem = (
                ht.HCCL_E_PARA,
                f"communicator id {member.comm_id} is unknown to this daemon",
            )
        elif rendezvous.state == "formed":
            problem = (
                ht.HCCL_E_PARA,
                f"this root info already formed communicator {member.comm_id}: "
                "call get_root_info for a new one",
            )
        elif rendezvous.state == "failed":
            problem = rendezvous.outcome
        elif rendezvous.n_ranks is not None and rendezvous.n_ranks != member.n_ranks:
            others = ", ".join(
                f"{m.describe()} passed n_ranks={m.n_ranks}"
                for m, _, _ in rendezvous.joined.values()
            )
            problem = (
                ht.HCCL_E_PARA,
                f"{member.describe()} passed n_ranks={member.n_ranks} but {others}",
            )
        elif member.rank in rendezvous.joined:
            holder = rendezvous.joined[member.rank][0]
            problem = (
                ht.HCCL_E_PARA,
                f"rank {member.rank} of communicator {member.comm_id} was already "
                f"joined by pid {holder.session.pid} (device {holder.device}); "
                f"pid {session.pid} asked for it again",
            )
        if problem is not None:
            self._reject(member, request_id, *problem)
            return
        assert rendezvous is not None
        rendezvous.n_ranks = n_ranks = member.n_ranks

        def finish(timed_out: bool) -> None:
            if timed_out and rendezvous.state == "open":
                missing = sorted(set(range(n_ranks)) - set(rendezvous.joined))
                self._fail_rendezvous(
                    rendezvous,
                    ht.HCCL_E_TIMEOUT,
                    (
                        f"communicator {rendezvous.comm_id} init timed out after "
                        f"{connect_timeout_s:g} s "
                        f"(HCCL_CONNECT_TIMEOUT of {member.describe()}): {rank_list(missing)} of "
                        f"{rendezvous.n_ranks} never joined"
                    ),
                )

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
        members = [rendezvous.joined[rank][0] for rank in range(len(rendezvous.joined))]
        comm = Communicator(rendezvous.comm_id, members, rendezvous.exec_timeout_s)
        devices = [m.device for m in members]
        if len(set(devices)) < len(devices):
            log.info(
                "communicator %d: several ranks share a device (%s), a simnpu extension",
                comm.id,
                devices,
            )
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

    def session_closed(self, session) -> list:
        """The session ended: fail the rendezvous its ranks were waiting in; return its ranks
        of formed communicators, now "gone", with the state each had before."""
        formed = []
        for member in self._members.pop(session, []):
            if member.state == "joining":
                rendezvous = self.rendezvous.get(member.comm_id)
                if (
                    rendezvous is not None
                    and rendezvous.state == "open"
                    and rendezvous.joined.get(member.rank, (None,))[0] is member
                ):
                    self._fail_rendezvous(
                        rendezvous,
                        ht.HCCL_E_REMOTE,
                        f"{member.describe()} ended before every rank joined "
                        f"communicator {member.comm_id}",
                    )
                continue
            if member.comm is not None and member.state != "gone":
                formed.append((member, member.state))
                member.state = "gone"
        return formed
