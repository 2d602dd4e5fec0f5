"""HCCL: root infos, communicator init and destroy, the async-error query (their replies'
code is an HcclResult), the job rendezvous (a simnpu extension: identical processes get their
rank and root info, server/hccl/job_rendezvous.py), and the collective commands, each a task of
the rank's stream (server/hccl/collective_task.py). Their arguments are checked by
server/hccl/call_arguments.py; the matching and data movement are server/hccl/collectives.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.proto.service import is_tcp_address
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.core.untrusted import JOB_SEED, SERVER_ADDRESSES, quoted
from simnpu.server.hccl import call_arguments
from simnpu.server.hccl.collective_task import CollectiveTask
from simnpu.server.hccl.communicators import HcclFailure, Member, member_of
from simnpu.server.hccl.job_rendezvous import Arrival, job_problem
from simnpu.server.hccl.root_infos import tenant_table_key

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
    timeout_s = call_arguments.exec_timeout_s(request.exec_timeout_ms)
    communicators = session.collectives.communicators

    def issue() -> None:
        info = communicators.issue_root_info(
            session, session.pid, request.device, timeout_s, session.tenant
        )
        session.respond(reply_to, pb.HcclGetRootInfoReply(root_info=info))

    session.post(issue)


@handles(pb.HcclCommInitRequest)
@_hccl
def comm_init(session: Session, request: pb.HcclCommInitRequest, reply_to: int) -> None:
    """HcclCommInitRootInfo: answers once every rank has joined (or failed)."""
    communicators = session.collectives.communicators
    info = communicators.parse_root_info(request.root_info)
    session.device(request.device)
    call_arguments.check_ranks(request.n_ranks, request.rank)
    member = Member(session, request.rank, request.n_ranks, request.device, info.comm_id)
    member.handle = session.handles.add(member, HandleKind.COMMUNICATOR)
    connect_timeout_s = call_arguments.connect_timeout_s(request.connect_timeout_ms)
    if communicators.is_local(info):
        session.post(communicators.join, member, connect_timeout_s, reply_to, info.secret)
    else:  # another daemon's root info: a world across hosts (docs/multihost.md)
        session.post(communicators.join_elsewhere, member, info, connect_timeout_s, reply_to)


@handles(pb.HcclCommInitClusterRequest)
@_hccl
def comm_init_cluster(
    session: Session, request: pb.HcclCommInitClusterRequest, reply_to: int
) -> None:
    """HcclCommInitClusterInfo: the ranks that join with the same rank table form one
    communicator; answers once every rank of the table has joined (or failed)."""
    table = call_arguments.parse_rank_table(request.rank_table)
    call_arguments.check_length(
        request.server_addresses, SERVER_ADDRESSES, "SIMNPU_SERVER_ADDRESSES"
    )
    session.device(request.device)
    communicators = session.collectives.communicators
    entry, addresses = call_arguments.cluster_place(
        table,
        request.rank,
        request.device,
        request.server_addresses,
        communicators.worlds.advertise,
    )
    connect_timeout_s = call_arguments.connect_timeout_s(request.connect_timeout_ms)
    exec_timeout_s = call_arguments.exec_timeout_s(request.exec_timeout_ms)
    member = Member(session, entry.rank, len(table.ranks), request.device, comm_id=0)
    member.handle = session.handles.add(member, HandleKind.COMMUNICATOR)
    table_key = tenant_table_key(table.key, session.tenant)

    def join() -> None:
        if addresses and addresses[0] != communicators.worlds.advertise:
            communicators.join_table_elsewhere(
                member, addresses[0], table_key, connect_timeout_s, exec_timeout_s, reply_to
            )
            return
        member.comm_id = communicators.table_comm_id(
            table_key, session.pid, request.device, session.tenant
        )
        rendezvous = communicators.rendezvous[member.comm_id]
        rendezvous.host_order = addresses
        if member.rank == 0:  # rank 0's HCCL_EXEC_TIMEOUT becomes the communicator's
            rendezvous.exec_timeout_s = exec_timeout_s
        communicators.join(member, connect_timeout_s, reply_to, None)

    session.post(join)


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


# ---- the job rendezvous -------------------------------------------------------------------------
@handles(pb.HcclRendezvousRequest)
def rendezvous(session: Session, request: pb.HcclRendezvousRequest, reply_to: int) -> object:
    """Wait for the job's world; the arguments are checked here, the rest under the scheduler.
    Answers with an HcclResult."""
    job, world_size = request.job, request.world_size
    problem = job_problem(job, world_size)
    if problem is None and len(request.seed) > JOB_SEED:
        problem = f"job {job!r}: SIMNPU_JOB_SEED {quoted(request.seed)} is longer than {JOB_SEED}"
    if problem is None and request.seed and not is_tcp_address(request.seed):
        problem = f"job {job!r}: SIMNPU_JOB_SEED {request.seed!r} is not host:port"
    if problem is not None:
        session.respond(reply_to, code=ht.HCCL_E_PARA, message=problem)
        return LATER
    exec_timeout_s = call_arguments.exec_timeout_s(request.exec_timeout_ms)
    timeout_s = call_arguments.connect_timeout_s(request.timeout_ms)
    arrival = Arrival(session, reply_to, world_size, exec_timeout_s, session.tenant)
    jobs = session.daemon.jobs
    assert jobs is not None, "jobs exist once the daemon runs"
    if request.seed and request.seed != session.collectives.worlds.advertise:
        session.post(jobs.forward, request.seed, job, arrival, timeout_s)
    else:
        session.post(jobs.arrive, job, arrival, timeout_s)
    return LATER


# ---- the collectives -----------------------------------------------------------------------------
@handles(commands.Collective)
def collective(session: Session, record: commands.Collective) -> None:
    """One collective or send/recv of a rank (async): checked, then queued on its stream."""
    member = member_of(session, record.comm)
    stream = session.stream(record.stream)
    device = session.daemon.devices[member.device]
    call = call_arguments.collective_call(record, member, stream.device, session.memory, device)
    session.submit(CollectiveTask(session.seq, stream, member, call, session.collectives))
