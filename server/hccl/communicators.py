"""HCCL communicators: root infos, the init rendezvous, destroy, and the requests that
drive them (HcclGetRootInfo, HcclCommInitRootInfo, HcclCommDestroy, HcclGetCommAsyncError).

- Root info: the daemon issues a communicator id to the root rank's process, of its
  tenant, and records that process's HCCL_EXEC_TIMEOUT; the bytes (server/hccl/root_infos.py)
  carry the id, the communicator's secret, the daemon's identity and its advertised
  address. A rank joins only with the secret, as a process of the same tenant. A rank that
  joins with another daemon's root info joins a world across hosts through that address
  (server/hccl/world_membership.py); without an address it is refused.
- Init: each rank's HcclCommInitRootInfo is a deferred request; the replies go out when
  every rank has joined, or with HCCL_E_TIMEOUT (naming the missing ranks) when a rank's
  HCCL_CONNECT_TIMEOUT passes first. Bad n_ranks / rank / a reused root info ->
  HCCL_E_PARA; a rank whose process ends during init -> HCCL_E_REMOTE for the others.

The requests (server/control/handlers/hccl_calls.py) check their arguments on the session's
thread; the rest runs under the scheduler (its thread, or its lock), which owns all the
state here. What runs on a formed communicator is server/hccl/collectives.py.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import bad_handle
from simnpu.server.core.rate_limits import log_about
from simnpu.server.core.tenants import Tenant
from simnpu.server.core.waiters import Waiter
from simnpu.server.hccl import root_infos
from simnpu.server.hccl.root_infos import RootInfo

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.server.hccl.daemon_links import Link

log = logging.getLogger("simnpu.collectives")

ENDED_KEPT = 4096  # ended rendezvous remembered, to tell a late joiner what became of its id
UNJOINED_PER_SESSION = 1024  # root infos a session issued that nobody joined yet, at most


class HcclFailure(Exception):
    """A request that fails with an HcclResult (the reply's code)."""

    def __init__(self, result: int, message: str):
        super().__init__(message)
        self.result = result
        self.message = message


T = TypeVar("T")


class HandleTable(Protocol):
    """What HCCL does with a session's handle table (server/control/session.py, `Handles`)."""

    def get(self, handle: int, cls: type[T], what: str) -> T: ...

    def remove(self, handle: int) -> Any: ...


class RankSession(Protocol):
    """What HCCL uses of the session of a rank's process (server/control/session.py,
    `Session`, is the one): who it is, whether it ended, its handle table, and how a request
    of it is answered (from any thread)."""

    @property
    def pid(self) -> int: ...

    @property
    def tenant(self) -> Tenant: ...

    @property
    def closed(self) -> bool: ...

    @property
    def handles(self) -> HandleTable: ...

    def respond(
        self, request_id: int, body: Message | None = None, code: int = 0, message: str = ""
    ) -> None: ...


@dataclass(eq=False)
class Member:
    """One rank of a communicator: what the handle in the rank's session stands for."""

    session: RankSession  # the session of the process that joined
    rank: int
    n_ranks: int
    device: int
    comm_id: int
    handle: int = 0
    comm: Communicator | None = None  # set once every rank has joined
    state: str = "joining"  # joining -> ready -> destroyed | gone
    collectives: int = 0  # collectives submitted (eager or replayed; under the scheduler)
    sends: dict = field(default_factory=dict)  # peer -> sends submitted (likewise)
    recvs: dict = field(default_factory=dict)  # peer -> recvs submitted (likewise)
    error: tuple | None = None  # (HcclResult, message): HcclGetCommAsyncError

    def describe(self) -> str:
        return f"rank {self.rank} (pid {getattr(self.session, 'pid', '?')}, device {self.device})"

    def take_key(self, call) -> tuple:
        """The next place of this rank's `call` (a collectives.Call) in its communicator's
        order: ("c", k) for its k-th collective, ("p", src, dst, j) for the j-th send/recv
        of a pair (under the scheduler, at the call's submission)."""
        if call.kind == ht.HCCL_CMD_SEND:
            index = self.sends.get(call.root, 0)
            self.sends[call.root] = index + 1
            return ("p", self.rank, call.root, index)
        if call.kind == ht.HCCL_CMD_RECEIVE:
            index = self.recvs.get(call.root, 0)
            self.recvs[call.root] = index + 1
            return ("p", call.root, self.rank, index)
        self.collectives += 1
        return ("c", self.collectives - 1)

    def never_reaches(self, key: tuple) -> bool:
        """After destroy: True if this rank submitted nothing under `key` before it left."""
        if key[0] == "c":
            return key[1] >= self.collectives
        _, src, dst, index = key
        return index >= (self.sends.get(dst, 0) if self.rank == src else self.recvs.get(src, 0))


@dataclass(eq=False)
class RemoteRank:
    """A rank served by another host's daemon, among a communicator's members (and, at the
    coordinator, in a rendezvous until it forms)."""

    rank: int
    n_ranks: int
    device: int
    pid: int
    host: str  # its daemon's advertised address
    comm_id: int
    link: Link | None = None  # at the coordinator: the stream its join came on
    state: str = "joining"

    def describe(self) -> str:
        return f"rank {self.rank} (pid {self.pid}, device {self.device}, host {self.host})"


@dataclass(eq=False)
class Rendezvous:
    comm_id: int
    exec_timeout_s: float
    root_pid: int
    root_device: int
    tenant: Tenant  # whose ranks may join: the root info's issuer's, or the rank table's
    issuer: object = None  # the Session that asked for the root info (None: a rank table's)
    secret: bytes = b""  # what its root info's joiners present (a rank table's: none)
    n_ranks: int | None = None
    table_key: bytes | None = None  # formed from a rank table: its key (proto/rank_table.py)
    joined: dict = field(default_factory=dict)  # rank -> (member, waiter, request id)
    state: str = "open"  # open -> formed | failed
    outcome: tuple | None = None  # failed: (HcclResult, message)
    host_order: tuple = ()  # a rank table's daemon addresses in server order (across hosts)


@dataclass(eq=False)
class Communicator:
    id: int
    members: list  # by rank: Member, or RemoteRank for a rank of another host
    exec_timeout_s: float
    ops: dict = field(default_factory=dict)  # key -> Op waiting for ranks
    failed: dict = field(default_factory=dict)  # key -> (codes, message, ranks yet to arrive)
    broken: tuple | None = None  # (codes, message): a rank is gone for good
    world: Any = None  # a world.World when its ranks span hosts

    @property
    def n_ranks(self) -> int:
        return len(self.members)

    def local_members(self) -> list[Member]:
        return [m for m in self.members if not isinstance(m, RemoteRank)]

    def ranks_of(self, key: tuple) -> tuple:
        """The ranks that take part in `key` on this daemon: a collective's local ranks, a
        send/recv's pair (its local rank, when the other is on another host)."""
        if key[0] == "p":
            pair = (key[1], key[2])
            return tuple(r for r in pair if not isinstance(self.members[r], RemoteRank))
        if self.world is None:
            return tuple(range(self.n_ranks))
        return tuple(m.rank for m in self.local_members())

    def title(self, key: tuple) -> str:
        """How messages name the collective or send/recv `key` of this communicator."""
        if key[0] == "c":
            return f"collective #{key[1]} on communicator {self.id}"
        return f"send/recv #{key[3]} from rank {key[1]} to rank {key[2]} on communicator {self.id}"


def member_of(session, handle: int) -> Member:
    """The formed communicator rank a session's handle stands for (else 107017)."""
    member = session.handles.get(handle, Member, "communicator")
    if member.comm is None:
        raise bad_handle("communicator", handle)
    return member


def _process(member) -> str:
    """A joining rank's process: "pid P", with its host if it is another host's."""
    if isinstance(member, RemoteRank):
        return f"pid {member.pid} on host {member.host}"
    return f"pid {member.session.pid}"


def rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class Communicators:
    """Root infos, rendezvous and the ranks of every session (scheduler-owned)."""

    def __init__(self, scheduler, worlds):
        self.scheduler = scheduler
        self.worlds = worlds  # server/hccl/world_membership.py: ranks of other hosts
        self.pid = os.getpid()
        self.nonce = os.urandom(16)
        self._ids = itertools.count(1)
        self.rendezvous: dict[int, Rendezvous] = {}  # the open ones, by comm id
        self._ended: OrderedDict[int, tuple[int, str]] = OrderedDict()  # comm id -> its end
        self._unjoined: dict[object, OrderedDict[int, None]] = {}  # issuer -> open, unjoined
        self._tables: dict[bytes, int] = {}  # rank table key -> comm id of its open rendezvous
        self._members: dict = {}  # session -> [Member]

    def issue_root_info(
        self, issuer: object, pid: int, device: int, exec_timeout_s: float, tenant: Tenant
    ) -> bytes:
        """A new communicator id as root info bytes (scheduler): for HcclGetRootInfo, and for
        a job's rendezvous (server/hccl/job_rendezvous.py) on behalf of its rank 0, process `pid`.
        Only ranks of `tenant` that present its secret (in the bytes) may join it.
        It lives while its issuer does (a session, or the Peer link a remote rank 0 came
        on: forget_issuer), or once a rank joined it; an issuer holds at most
        UNJOINED_PER_SESSION that nobody joined: beyond, its oldest is forgotten."""
        comm_id = next(self._ids)
        secret = root_infos.new_secret()
        self.rendezvous[comm_id] = Rendezvous(
            comm_id, exec_timeout_s, pid, device, tenant, issuer=issuer, secret=secret
        )
        unjoined = self._unjoined.setdefault(issuer, OrderedDict())
        unjoined[comm_id] = None
        if len(unjoined) > UNJOINED_PER_SESSION:
            oldest, _ = unjoined.popitem(last=False)
            del self.rendezvous[oldest]
        info = RootInfo(comm_id, self.pid, self.nonce, secret, self.worlds.advertise or "")
        return root_infos.pack(info, device)

    def table_comm_id(self, table_key: bytes, pid: int, device: int, tenant: Tenant) -> int:
        """The communicator id that the ranks of `tenant` joining with the rank table
        `table_key` (tenant_table_key's) form now (scheduler): that of its open rendezvous,
        else a new one. A table forms one communicator at a time; once formed (or failed),
        the next joiner starts another."""
        comm_id = self._tables.get(table_key)
        if comm_id is None:
            comm_id = next(self._ids)
            self.rendezvous[comm_id] = Rendezvous(
                comm_id, ht.DEFAULT_EXEC_TIMEOUT_S, pid, device, tenant, table_key=table_key
            )
            self._tables[table_key] = comm_id
        return comm_id

    def parse_root_info(self, data: bytes) -> RootInfo:
        """The root info's fields; HCCL_E_PARA if it is not one, or is another daemon's
        that carries no address."""
        info = root_infos.parse(data)
        if isinstance(info, str):
            raise HcclFailure(ht.HCCL_E_PARA, info)
        if info.nonce != self.nonce and not info.address:
            raise HcclFailure(
                ht.HCCL_E_PARA,
                f"the root info was issued by another simnpu daemon (pid {info.pid}), "
                f"not this one (pid {self.pid}), which advertises no address to join it by "
                "(docs/multihost.md)",
            )
        return info

    def is_local(self, info: RootInfo) -> bool:
        return info.nonce == self.nonce

    # ==== init (scheduler thread) ================================================================
    def join(
        self, member: Member, connect_timeout_s: float, request_id: int, secret: bytes | None
    ) -> None:
        """HcclCommInitRootInfo of `member` with its root info's `secret` (None:
        HcclCommInitClusterInfo's, whose table key is its tenant's) (under the scheduler): it
        waits for the others."""
        self._members.setdefault(member.session, []).append(member)
        if secret is not None:
            problem = self.admission_problem(member.comm_id, secret, member.session.tenant)
            if problem is not None:
                self.reject(member, request_id, *problem)
                return
        self._join(member, connect_timeout_s, request_id)

    def admission_problem(
        self, comm_id: int, secret: bytes, tenant: Tenant
    ) -> tuple[int, str] | None:
        """Why ranks of `tenant` presenting `secret` may not join the open rendezvous
        `comm_id` (None: they may, or it is not open: _join says what became of it)."""
        rendezvous = self.rendezvous.get(comm_id)
        if rendezvous is None:
            return None
        if (
            rendezvous.table_key is not None
            or not hmac.compare_digest(rendezvous.secret, secret)
            or rendezvous.tenant != tenant
        ):
            return (
                ht.HCCL_E_PARA,
                f"the root info of communicator {comm_id} was made up, or issued to another "
                "tenant: a rank joins with the bytes HcclGetRootInfo gave a process of its own "
                "tenant (docs/security.md)",
            )
        return None

    def join_remote(self, remote: RemoteRank, connect_timeout_s: float) -> None:
        """At the coordinator: a rank of another host joined the rendezvous of one of this
        daemon's root infos (server/hccl/world_membership.py)."""
        self._join(remote, connect_timeout_s, 0)

    def join_elsewhere(
        self, member: Member, info: RootInfo, connect_timeout_s: float, request_id: int
    ) -> None:
        """HcclCommInitRootInfo with another daemon's root info: a world across hosts."""
        self._members.setdefault(member.session, []).append(member)
        try:
            self.worlds.join_remote(
                member, info.address, info.nonce, connect_timeout_s, request_id, info.secret
            )
        except Exception as error:  # noqa: BLE001 - HcclFailure, or the address is bad
            result = getattr(error, "result", ht.HCCL_E_PARA)
            self.reject(member, request_id, result, getattr(error, "message", str(error)))

    def join_table_elsewhere(
        self,
        member: Member,
        coordinator: str,
        table_key: bytes,
        connect_timeout_s: float,
        exec_timeout_s: float,
        request_id: int,
    ) -> None:
        """HcclCommInitClusterInfo of a rank whose table's first server is another host's:
        its world forms at that server's daemon."""
        self._members.setdefault(member.session, []).append(member)
        try:
            self.worlds.join_remote(
                member,
                coordinator,
                b"",
                connect_timeout_s,
                request_id,
                table_key=table_key,
                exec_timeout_s=exec_timeout_s,
            )
        except Exception as error:  # noqa: BLE001 - HcclFailure
            result = getattr(error, "result", ht.HCCL_E_PARA)
            self.reject(member, request_id, result, getattr(error, "message", str(error)))

    def join_remote_table(
        self,
        remote: RemoteRank,
        table_key: bytes,
        tenant: Tenant,
        connect_timeout_s: float,
        exec_s: float,
    ) -> None:
        """At the coordinator: a rank of another host, of `tenant`, joined with a rank table
        (`table_key`: tenant_table_key's) whose first server is this daemon's."""
        remote.comm_id = self.table_comm_id(table_key, remote.pid, remote.device, tenant)
        if remote.rank == 0 and exec_s > 0:
            self.rendezvous[remote.comm_id].exec_timeout_s = exec_s
        self._join(remote, connect_timeout_s, 0)

    def _join(self, member, connect_timeout_s: float, request_id: int) -> None:
        rendezvous = self.rendezvous.get(member.comm_id)
        problem: tuple | None = None
        if rendezvous is None:
            problem = self._ended.get(member.comm_id) or (
                ht.HCCL_E_PARA,
                f"communicator id {member.comm_id} is unknown to this daemon (its root info "
                "was forgotten: its process ended before any rank joined, or it issued "
                f"{UNJOINED_PER_SESSION} newer ones nobody joined)",
            )
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
                f"joined by {_process(holder)} (device {holder.device}); "
                f"{_process(member)} asked for it again",
            )
        if problem is not None:
            self.reject(member, request_id, *problem)
            return
        assert rendezvous is not None
        rendezvous.n_ranks = n_ranks = member.n_ranks
        unjoined = self._unjoined.get(rendezvous.issuer)
        if unjoined is not None:  # joined: it lives until it forms or fails
            unjoined.pop(rendezvous.comm_id, None)

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

    def reject(self, member, request_id: int, result: int, message: str) -> None:
        """A rank's init fails: answer it (a remote rank: through its daemon)."""
        member.state = "gone"
        if isinstance(member, RemoteRank):
            self.worlds.reject_remote(member, result, message)
            return
        member.session.handles.remove(member.handle)
        member.session.respond(request_id, code=result, message=message)

    def remote_problem(
        self, comm_id: int, nonce: bytes, secret: bytes, tenant: Tenant
    ) -> tuple[int, str] | None:
        """Why a member daemon's ranks of `tenant`, presenting `secret`, cannot join
        communicator `comm_id` here (None: they can)."""
        if nonce != self.nonce:
            return (
                ht.HCCL_E_PARA,
                f"the root info was not issued by the daemon at {self.worlds.advertise} "
                "(it was restarted, or another daemon advertises its address)",
            )
        if comm_id not in self.rendezvous:
            return self._ended.get(comm_id) or (
                ht.HCCL_E_PARA,
                f"communicator id {comm_id} is unknown to the daemon at {self.worlds.advertise}",
            )
        return self.admission_problem(comm_id, secret, tenant)

    def fail_open(self, comm_id: int, result: int, message: str, host: str | None = None) -> None:
        """At the coordinator: the open rendezvous `comm_id` fails (a member daemon reported
        a failure, or was lost: `host`, if none of its ranks has joined, fails nothing)."""
        rendezvous = self.rendezvous.get(comm_id)
        if rendezvous is None or rendezvous.state != "open":
            return
        if host is not None and not any(
            isinstance(m, RemoteRank) and m.host == host for m, _, _ in rendezvous.joined.values()
        ):
            return
        self._fail_rendezvous(rendezvous, result, message)

    def _form(self, rendezvous: Rendezvous) -> None:
        members = [rendezvous.joined[rank][0] for rank in range(len(rendezvous.joined))]
        comm = Communicator(rendezvous.comm_id, members, rendezvous.exec_timeout_s)
        remote = any(isinstance(m, RemoteRank) for m in members)
        reply_type = (  # HcclCommInitRootInfo's, or HcclCommInitClusterInfo's
            pb.HcclCommInitReply if rendezvous.table_key is None else pb.HcclCommInitClusterReply
        )
        devices = [m.device for m in members if not isinstance(m, RemoteRank)]
        if len(set(devices)) < len(devices):
            log_about(  # charged to the client of the first rank (server/core/rate_limits.py)
                getattr(getattr(members[0], "session", None), "owner", None),
                log,
                logging.INFO,
                "communicator %d: several ranks share a device (%s), a simnpu extension",
                comm.id,
                devices,
            )
        for member, waiter, request_id in rendezvous.joined.values():
            waiter.finished = True
            member.state = "ready"
            if isinstance(member, RemoteRank):
                continue
            member.comm = comm
            member.session.respond(request_id, reply_type(comm=member.handle, comm_id=comm.id))
        if remote:
            self.worlds.coordinator_formed(comm, rendezvous.exec_timeout_s, rendezvous.host_order)
        self._close(
            rendezvous,
            "formed",
            (
                ht.HCCL_E_PARA,
                f"this root info already formed communicator {rendezvous.comm_id}: "
                "call get_root_info for a new one",
            ),
        )
        rendezvous.joined = {}

    def form_world_communicator(
        self, members: list, exec_timeout_s: float, joined: object, reply_type: type
    ) -> Communicator:
        """At a member: the world formed at its coordinator; this daemon's communicator of
        it (an id of its own), its ranks answered with `reply_type` (HcclCommInitRootInfo's
        or HcclCommInitClusterInfo's). `joined`: (Member, request id) pairs."""
        comm = Communicator(next(self._ids), members, exec_timeout_s)
        for member, request_id in joined:  # type: ignore[attr-defined]
            member.comm = comm
            member.state = "ready"
            member.session.respond(request_id, reply_type(comm=member.handle, comm_id=comm.id))
        return comm

    def _close(self, rendezvous: Rendezvous, state: str, outcome: tuple[int, str]) -> None:
        """The rendezvous formed or failed: forget it, but for what a late joiner of its id
        is told (`outcome`, kept for the last ENDED_KEPT)."""
        rendezvous.state = state
        rendezvous.outcome = outcome
        del self.rendezvous[rendezvous.comm_id]
        self._ended[rendezvous.comm_id] = outcome
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        if rendezvous.table_key is not None and self._tables.get(rendezvous.table_key) == (
            rendezvous.comm_id
        ):
            del self._tables[rendezvous.table_key]

    def _fail_rendezvous(self, rendezvous: Rendezvous, result: int, message: str) -> None:
        self._close(rendezvous, "failed", (result, message))
        joined, rendezvous.joined = rendezvous.joined, {}
        for member, waiter, request_id in joined.values():
            waiter.finished = True
            self.reject(member, request_id, result, message)
        self.worlds.rendezvous_ended(rendezvous.comm_id)

    def forget_issuer(self, issuer: object) -> None:
        """The issuer of root infos ended: forget those nobody joined."""
        for comm_id in self._unjoined.pop(issuer, {}):
            del self.rendezvous[comm_id]

    def session_closed(self, session) -> list:
        """The session ended: forget the root infos it issued that nobody joined, fail the
        rendezvous its ranks were waiting in; return its ranks of formed communicators, now
        "gone", with the state each had before."""
        self.forget_issuer(session)
        formed = []
        for member in self._members.pop(session, []):
            if member.state == "joining":
                self.worlds.member_left(member)
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
