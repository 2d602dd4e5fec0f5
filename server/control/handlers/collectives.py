"""HCCL: root infos, communicator init and destroy, the async-error query (their replies'
code is an HcclResult), and the collective commands, each a task of the rank's stream
(server/hccl/collective_task.py; the matching and data movement are server/hccl/collectives.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import codes, commands, rank_table
from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.unit_protocol import Span
from simnpu.server.hccl.collective_task import CollectiveTask
from simnpu.server.hccl.collectives import Call
from simnpu.server.hccl.communicators import HcclFailure, Member, member_of

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


def _hccl(handler: Callable) -> Callable:
    """An HCCL request: its failures answer with an HcclResult (a bad handle or argument:
    HCCL_E_PARA); it answers itself, from the scheduler."""

    def run(session: Session, request, reply_to: int) -> object:
        try:
            handler(session, request, reply_to)
        except HcclFailure as failure:
            session.respond(reply_to, code=failure.result, message=failure.message)
        except NpuError as error:
            session.respond(reply_to, code=ht.HCCL_E_PARA, message=error.message)
        return LATER

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


@handles(pb.HcclGetRootInfoRequest)
@_hccl
def get_root_info(session: Session, request: pb.HcclGetRootInfoRequest, reply_to: int) -> None:
    """HcclGetRootInfo: a new communicator id, with this process's HCCL_EXEC_TIMEOUT."""
    session.device(request.device)
    timeout_s = (
        ht.DEFAULT_EXEC_TIMEOUT_S
        if request.exec_timeout_ms < 0
        else request.exec_timeout_ms / 1000.0
    )
    communicators = session.collectives.communicators

    def issue() -> None:
        info = communicators.issue_root_info(session, session.pid, request.device, timeout_s)
        session.respond(reply_to, pb.HcclGetRootInfoReply(root_info=info))

    session.post(issue)


@handles(pb.HcclCommInitRequest)
@_hccl
def comm_init(session: Session, request: pb.HcclCommInitRequest, reply_to: int) -> None:
    """HcclCommInitRootInfo: answers once every rank has joined (or failed)."""
    communicators = session.collectives.communicators
    info = communicators.parse_root_info(request.root_info)
    session.device(request.device)
    n_ranks, rank = request.n_ranks, request.rank
    if not 1 <= n_ranks <= ht.MAX_RANKS:
        raise HcclFailure(ht.HCCL_E_PARA, f"n_ranks {n_ranks} is not in [1, {ht.MAX_RANKS}]")
    if not 0 <= rank < n_ranks:
        raise HcclFailure(ht.HCCL_E_PARA, f"rank {rank} is not in [0, n_ranks={n_ranks})")
    member = Member(session, rank, n_ranks, request.device, info.comm_id)
    member.handle = session.handles.add(member, HandleKind.COMMUNICATOR)
    connect_timeout_s = _connect_timeout_s(request.connect_timeout_ms)
    if communicators.is_local(info):
        session.post(communicators.join, member, connect_timeout_s, reply_to)
    else:  # another daemon's root info: a world across hosts (docs/multihost.md)
        session.post(communicators.join_elsewhere, member, info, connect_timeout_s, reply_to)


@handles(pb.HcclCommInitClusterRequest)
@_hccl
def comm_init_cluster(
    session: Session, request: pb.HcclCommInitClusterRequest, reply_to: int
) -> None:
    """HcclCommInitClusterInfo: the ranks that join with the same rank table form one
    communicator; answers once every rank of the table has joined (or failed)."""
    try:
        table = rank_table.parse(request.rank_table)
        session.device(request.device)
        if not table.completed:
            raise HcclFailure(
                ht.HCCL_E_PARA, f"the rank table's status is {table.status!r}, not 'completed'"
            )
        entry = table.entry(request.rank, request.device)
        addresses = (
            table.daemon_addresses(request.server_addresses) if len(table.servers) > 1 else ()
        )
    except rank_table.RankTableError as error:
        raise HcclFailure(error.result, error.message) from None
    communicators = session.collectives.communicators
    if addresses:  # a world across hosts (docs/multihost.md)
        advertise = communicators.worlds.advertise
        if addresses[entry.server_index] != advertise:
            raise HcclFailure(
                ht.HCCL_E_PARA,
                f"rank {entry.rank} is on server {entry.server_id!r} of the rank table, whose "
                f"daemon is at {addresses[entry.server_index]}; this daemon "
                + (f"is at {advertise}" if advertise else "advertises no address (--advertise)"),
            )
    connect_timeout_s = _connect_timeout_s(request.connect_timeout_ms)
    exec_timeout_s = (
        ht.DEFAULT_EXEC_TIMEOUT_S
        if request.exec_timeout_ms < 0
        else request.exec_timeout_ms / 1000.0
    )
    member = Member(session, entry.rank, len(table.ranks), request.device, comm_id=0)
    member.handle = session.handles.add(member, HandleKind.COMMUNICATOR)

    def join() -> None:
        if addresses and addresses[0] != communicators.worlds.advertise:
            communicators.join_table_elsewhere(
                member, addresses[0], table.key, connect_timeout_s, exec_timeout_s, reply_to
            )
            return
        member.comm_id = communicators.table_comm_id(table.key, session.pid, request.device)
        rendezvous = communicators.rendezvous[member.comm_id]
        rendezvous.host_order = addresses
        if member.rank == 0:  # rank 0's HCCL_EXEC_TIMEOUT becomes the communicator's
            rendezvous.exec_timeout_s = exec_timeout_s
        communicators.join(member, connect_timeout_s, reply_to)

    session.post(join)


def _connect_timeout_s(timeout_ms: int) -> float:
    """A request's HCCL_CONNECT_TIMEOUT in seconds (<= 0: HCCL's default)."""
    return timeout_ms / 1000.0 if timeout_ms > 0 else ht.DEFAULT_CONNECT_TIMEOUT_S


@handles(pb.HcclCommDestroyRequest)
@_hccl
def comm_destroy(session: Session, request: pb.HcclCommDestroyRequest, reply_to: int) -> None:
    """HcclCommDestroy: what the rank queued still runs; the other ranks' collectives it
    will never join fail."""
    member = member_of(session, request.comm)
    session.handles.remove(member.handle)
    collectives = session.collectives

    def leave() -> None:
        member.state = "destroyed"
        collectives.leave(member)
        session.respond(reply_to)

    session.post(leave)


@handles(pb.HcclCommAsyncErrorRequest)
@_hccl
def comm_async_error(
    session: Session, request: pb.HcclCommAsyncErrorRequest, reply_to: int
) -> None:
    """HcclGetCommAsyncError: the HcclResult of this rank's first failed collective."""
    member = member_of(session, request.comm)

    def answer() -> None:
        result, message = member.error or (ht.HCCL_SUCCESS, "")
        session.respond(reply_to, pb.HcclCommAsyncErrorReply(result=result, message=message))

    session.post(answer)


# ---- the collectives -----------------------------------------------------------------------------
def _buffer_bytes(kind: int, size: int, n: int, is_root: bool) -> tuple[int, int]:
    """(bytes the rank's call reads of its send buffer, writes of its recv buffer)."""
    return {
        ht.HCCL_CMD_ALLREDUCE: (size, size),
        ht.HCCL_CMD_REDUCE: (size, size if is_root else 0),
        ht.HCCL_CMD_BROADCAST: (size, 0),
        ht.HCCL_CMD_ALLGATHER: (size, size * n),
        ht.HCCL_CMD_REDUCE_SCATTER: (size * n, size),
        ht.HCCL_CMD_ALLTOALL: (size * n, size * n),
        ht.HCCL_CMD_SCATTER: (size * n if is_root else 0, size),
        ht.HCCL_CMD_SEND: (size, 0),
        ht.HCCL_CMD_RECEIVE: (0, size),
        ht.HCCL_CMD_BARRIER: (0, 0),
    }[kind]


def _buffer(session: Session, member: Member, address: int, nbytes: int, what: str) -> Span:
    if nbytes == 0:
        return Span(session.daemon.devices[member.device].region.name, 0, member.device)
    span = session.device_range(address, nbytes)
    if span.device != member.device:
        raise invalid(
            f"the {what} buffer {address:#x} is on device {span.device} but rank "
            f"{member.rank} of the communicator is on device {member.device}"
        )
    return span


@handles(commands.Collective)
def collective(session: Session, record: commands.Collective) -> None:
    """One collective or send/recv of a rank (async): checked, then queued on its stream."""
    member = member_of(session, record.comm)
    stream = session.stream(record.stream)
    if stream.device != member.device:
        raise invalid(
            f"the stream is on device {stream.device} but rank {member.rank} of the "
            f"communicator is on device {member.device}"
        )
    kind, count, dtype, n, rank = (
        record.kind,
        record.count,
        record.dtype,
        member.n_ranks,
        member.rank,
    )
    if kind not in ht.COLLECTIVE_NAMES:
        raise invalid(f"unknown collective {kind}")
    if kind != ht.HCCL_CMD_BARRIER and dtype not in ht.ITEM_SIZES:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"HCCL data type {dtype} is not supported by the simulated NPU",
        )
    if kind in ht.REDUCING and record.op not in ht.REDUCE_OP_NAMES:
        raise invalid(f"unknown reduce op {record.op}")
    if kind in ht.ROOTED + ht.POINT_TO_POINT and not 0 <= record.root < n:
        raise invalid(f"rank {record.root} is not in [0, {n})")
    if kind in ht.POINT_TO_POINT and record.root == rank:
        raise invalid(f"rank {rank} cannot send to or receive from itself")
    if kind == ht.HCCL_CMD_ALLTOALL and (record.recv_count, record.recv_dtype) != (count, dtype):
        raise invalid("alltoall needs recv_count == send_count and recv_type == send_type")
    send_bytes, recv_bytes = _buffer_bytes(
        kind, ht.ITEM_SIZES.get(dtype, 0) * count, n, rank == record.root
    )
    send = _buffer(session, member, record.send, send_bytes, "send")
    recv = _buffer(session, member, record.recv, recv_bytes, "recv")
    call = Call(
        kind,
        count,
        dtype,
        record.op,
        record.root,
        send,
        recv,
        record.recv_count,
        record.recv_dtype,
        send_bytes,
        recv_bytes,
    )
    session.submit(CollectiveTask(session.seq, stream, member, call, session.collectives))
