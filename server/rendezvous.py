"""Job rendezvous, a simnpu extension: identical processes get their rank and root info.

HCCL leaves it to the user to number the ranks and to hand rank 0's root info to the
others (torchrun, mpirun, a rank table). Identical replicas (`docker compose up --scale
rank=N`) have neither, so the daemon offers what torch.distributed's rendezvous does: a
process presents (job name, world size); once `world_size` processes of the job are
waiting, each gets a distinct rank, 0..N-1 in the order they arrived, and all get the same
root info, issued for the job as HcclGetRootInfo would be for rank 0 (that process, its
HCCL_EXEC_TIMEOUT, device 0). Then the job name is free again: the next `world_size`
arrivals form a new communicator, the job's formation 2, and so on; the daemon counts the
formations of the last JOBS_COUNTED job names that formed one, so a name unused for longer
starts over at 1.

- A waiting process that ends (exit, crash, SIGKILL) gives up its place: a replacement can
  take it, and nobody gets a rank until the world is complete.
- Waiting processes of one job must agree on the world size (else HCCL_E_PARA, naming them).
- A process waits at most its own timeout (HCCL_CONNECT_TIMEOUT); then HCCL_E_TIMEOUT says
  how many of the job had arrived.

The request (server/handlers/jobs.py) is checked on the session's thread; the rest runs
under the scheduler, which owns the state here, as in server/communicators.py.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.server.objects import Waiter

if TYPE_CHECKING:
    from simnpu.server.session import Session

log = logging.getLogger("simnpu.rendezvous")

MAX_JOB_NAME = 256
JOBS_COUNTED = 4096  # job names whose formations are counted: the most recently formed
ROOT_DEVICE = 0  # rank 0 uses device 0 whatever the device count (rank % devices)


@dataclass(eq=False)
class Arrival:
    """One process waiting for its job's world to be complete."""

    session: Session
    request_id: int
    world_size: int
    exec_timeout_s: float
    waiter: Waiter | None = None

    def describe(self) -> str:
        return f"pid {self.session.pid} (world size {self.world_size})"


class Jobs:
    """The jobs whose processes are waiting for their world (scheduler-owned)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.waiting: dict[str, list[Arrival]] = {}
        # job -> how many communicators it has formed, the most recently formed last
        self.formed: OrderedDict[str, int] = OrderedDict()

    def describe(self) -> dict:
        """{job: {"world_size": n, "waiting": [pid, ...]}} of the processes waiting now, for
        the Query RPC ("jobs"). Any thread."""
        view: dict = {}

        def read():
            for job, waiting in self.waiting.items():
                live = [a for a in waiting if not a.session.closed]
                if live:
                    view[job] = {
                        "world_size": live[0].world_size,
                        "waiting": [a.session.pid for a in live],
                    }

        self.scheduler.call(read)
        return view

    # ==== scheduler ===============================================================================
    def arrive(self, job: str, arrival: Arrival, timeout_s: float) -> None:
        """A process of `job` asks for its rank (under the scheduler)."""
        # processes that ended while they waited have given up their place
        waiting = [a for a in self.waiting.get(job, []) if not a.session.closed]
        disagree = [a for a in waiting if a.world_size != arrival.world_size]
        if disagree:
            self.waiting[job] = waiting
            others = ", ".join(a.describe() for a in disagree)
            arrival.session.respond(
                arrival.request_id,
                code=ht.HCCL_E_PARA,
                message=f"job {job!r}: {arrival.describe()} does not match the processes waiting: "
                f"{others}",
            )
            return
        waiting.append(arrival)
        if len(waiting) < arrival.world_size:
            self.waiting[job] = waiting
            arrival.waiter = Waiter(
                lambda: False,
                lambda timed_out: self._expire(job, arrival, timeout_s),
                time.monotonic() + timeout_s,
            )
            self.scheduler.watch(arrival.waiter)
            return
        self.waiting.pop(job, None)
        self._form(job, waiting)

    def _form(self, job: str, ranks: list[Arrival]) -> None:
        root = ranks[0]
        info = self.scheduler.collectives.communicators.issue_root_info(
            root.session, ROOT_DEVICE, root.exec_timeout_s
        )
        formation = self.formed.pop(job, 0) + 1
        self.formed[job] = formation
        if len(self.formed) > JOBS_COUNTED:
            self.formed.popitem(last=False)
        for rank, arrival in enumerate(ranks):
            if arrival.waiter is not None:
                arrival.waiter.finished = True  # its timer is dropped when it comes due
            arrival.session.respond(
                arrival.request_id,
                pb.HcclRendezvousReply(
                    rank=rank, world_size=len(ranks), formation=formation, job=job, root_info=info
                ),
            )
        log.info(
            "job %r (formation %d): %d ranks, pids %s",
            job,
            formation,
            len(ranks),
            [a.session.pid for a in ranks],
        )

    def _expire(self, job: str, arrival: Arrival, timeout_s: float) -> None:
        waiting = self.waiting.get(job, [])
        if arrival not in waiting:
            return
        waiting.remove(arrival)
        if not waiting:
            del self.waiting[job]
        present = [a for a in waiting if not a.session.closed]
        arrival.session.respond(
            arrival.request_id,
            code=ht.HCCL_E_TIMEOUT,
            message=f"job {job!r}: rendezvous timed out after {timeout_s:g} s "
            f"(HCCL_CONNECT_TIMEOUT of {arrival.describe()}): {len(present) + 1} of "
            f"{arrival.world_size} processes had arrived",
        )
