"""Job rendezvous, a simnpu extension: identical processes get their rank and root info
(server/hccl/job_rendezvous.py). Answers with an HcclResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.service import is_tcp_address
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.hccl.job_rendezvous import Arrival, job_problem

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.HcclRendezvousRequest)
def rendezvous(session: Session, request: pb.HcclRendezvousRequest, reply_to: int) -> object:
    """Wait for the job's world; the arguments are checked here, the rest under the scheduler."""
    job, world_size = request.job, request.world_size
    problem = job_problem(job, world_size)
    if problem is None and request.seed and not is_tcp_address(request.seed):
        problem = f"job {job!r}: SIMNPU_JOB_SEED {request.seed!r} is not host:port"
    if problem is not None:
        session.respond(reply_to, code=ht.HCCL_E_PARA, message=problem)
        return LATER
    exec_timeout_s = (
        ht.DEFAULT_EXEC_TIMEOUT_S
        if request.exec_timeout_ms < 0
        else request.exec_timeout_ms / 1000.0
    )
    timeout_s = (
        ht.DEFAULT_CONNECT_TIMEOUT_S if request.timeout_ms <= 0 else request.timeout_ms / 1000.0
    )
    arrival = Arrival(session, reply_to, world_size, exec_timeout_s)
    jobs = session.daemon.jobs
    assert jobs is not None, "jobs exist once the daemon runs"
    if request.seed and request.seed != session.collectives.worlds.advertise:
        session.post(jobs.forward, request.seed, job, arrival, timeout_s)
    else:
        session.post(jobs.arrive, job, arrival, timeout_s)
    return LATER
