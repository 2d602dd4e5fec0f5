"""Job rendezvous, a simnpu extension: identical processes get their rank and root info
(server/rendezvous.py). Answers with an HcclResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.server.handlers.registry import LATER, handles
from simnpu.server.rendezvous import MAX_JOB_NAME, Arrival

if TYPE_CHECKING:
    from simnpu.server.session import Session


@handles(pb.HcclRendezvousRequest)
def rendezvous(session: Session, request: pb.HcclRendezvousRequest, reply_to: int) -> object:
    """Wait for the job's world; the arguments are checked here, the rest under the scheduler."""
    job, world_size = request.job, request.world_size
    problem = None
    if not job or len(job) > MAX_JOB_NAME or not job.isprintable():
        problem = f"the job name must be 1..{MAX_JOB_NAME} printable characters, not {job!r}"
    elif not 1 <= world_size <= ht.MAX_RANKS:
        problem = f"job {job!r}: world size {world_size} is not in [1, {ht.MAX_RANKS}]"
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
    session.post(jobs.arrive, job, arrival, timeout_s)
    return LATER
