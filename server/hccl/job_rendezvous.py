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
- A job name is its tenant's (server/core/tenants.py): processes of different tenants that
  ask for the same name wait in different jobs, and a tenant sees only its own jobs.
- Waiting processes of one job must agree on the world size (else HCCL_E_PARA, naming them).
- A process waits at most its own timeout (HCCL_CONNECT_TIMEOUT); then HCCL_E_TIMEOUT says
  how many of the job had arrived.
- Across hosts (SIMNPU_JOB_SEED names one daemon, the seed): a daemon that is not the seed
  forwards its processes' arrivals to the seed over a Peer stream (server/hccl/daemon_links.py);
  the seed counts them with its own, and issues the root info, which carries its
  address, so the world forms across hosts (server/hccl/world_membership.py). A forwarded
  process that ends departs; a seed that cannot be reached fails its arrivals with
  HCCL_E_TCP_CONNECT.

The request (server/control/handlers/hccl_calls.py) is checked on the session's thread; the rest
runs under the scheduler, which owns the state here, as in server/hccl/communicators.py.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.server.core.rate_limits import log_about
from simnpu.server.core.tenants import Tenant
from simnpu.server.core.untrusted import quoted
from simnpu.server.core.waiters import Waiter
from simnpu.server.hccl.communicators import RankSession
from simnpu.server.hccl.daemon_links import Incoming, Link, Outgoing

log = logging.getLogger("simnpu.rendezvous")

MAX_JOB_NAME = 256
JOBS_COUNTED = 4096  # job names whose formations are counted: the most recently formed
ROOT_DEVICE = 0  # rank 0 uses device 0 whatever the device count (rank % devices)

JobKey = tuple[Tenant, str]  # a job: its tenant and its name


@dataclass(eq=False)
class RemoteProcess:
    """At the seed: a process waiting at another host's daemon, in place of its session."""

    link: Link  # the member daemon's stream
    id: int  # the member's number for the arrival
    pid: int
    closed: bool = False  # it departed, or its daemon's stream ended

    def respond(
        self,
        request_id: int,
        body: pb.HcclRendezvousReply | None = None,
        code: int = 0,
        message: str = "",
    ) -> None:
        """Tell the member daemon what the rendezvous gave the process."""
        assigned = pb.PeerAssigned(id=self.id, result=code, message=message)
        if body is not None:
            assigned.reply.CopyFrom(body)
        self.link.send(pb.PeerMessage(assigned=assigned))


@dataclass(eq=False)
class Arrival:
    """One process waiting for its job's world to be complete."""

    session: RankSession | RemoteProcess
    request_id: int
    world_size: int
    exec_timeout_s: float
    tenant: Tenant  # whose job it asks for: the session's, or what its daemon said
    waiter: Waiter | None = None

    def describe(self) -> str:
        session = self.session
        where = f" on host {session.link.address}" if isinstance(session, RemoteProcess) else ""
        return f"pid {self.session.pid}{where} (world size {self.world_size})"

    @property
    def remote(self) -> bool:
        return isinstance(self.session, RemoteProcess)


@dataclass(eq=False)
class _Forwarded:
    """At a member: a local process's arrival, forwarded to the seed."""

    seed: str
    arrival: Arrival
    id: int = field(default=0)


class Jobs:
    """The jobs whose processes are waiting for their world (scheduler-owned)."""

    def __init__(self, scheduler, collectives):
        self.scheduler = scheduler
        self.collectives = collectives  # the daemon's (server/hccl/collectives.py)
        self.waiting: dict[JobKey, list[Arrival]] = {}
        # job -> how many communicators it has formed, the most recently formed last
        self.formed: OrderedDict[JobKey, int] = OrderedDict()
        self._seeds: dict[str, Link] = {}  # at a member: the stream to each seed
        self._forwarded: dict[int, _Forwarded] = {}  # at a member: by id, waiting at a seed
        self._ids = itertools.count(1)
        self._remote: dict[Link, dict[int, RemoteProcess]] = {}  # at the seed: by member

    def describe(self, viewer: Tenant) -> dict:
        """{job: {"world_size": n, "waiting": [pid, ...]}} of the processes waiting now in
        the jobs tenant `viewer` may see, for the Query RPC ("jobs"); another tenant's job
        (the operator's view) as "job (tenant)". Any thread."""
        view: dict = {}

        def read():
            for (tenant, job), waiting in self.waiting.items():
                live = [a for a in waiting if not a.session.closed]
                if live and viewer.sees(tenant):
                    view[job if tenant == viewer else f"{job} ({tenant})"] = {
                        "world_size": live[0].world_size,
                        "waiting": [a.session.pid for a in live],
                    }

        self.scheduler.call(read)
        return view

    # ==== scheduler ===============================================================================
    def arrive(self, job: str, arrival: Arrival, timeout_s: float) -> None:
        """A process of `job` (its tenant's) asks for its rank (under the scheduler)."""
        key = (arrival.tenant, job)
        # processes that ended while they waited have given up their place
        waiting = [a for a in self.waiting.get(key, []) if not a.session.closed]
        disagree = [a for a in waiting if a.world_size != arrival.world_size]
        if disagree:
            self.waiting[key] = waiting
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
            self.waiting[key] = waiting
            arrival.waiter = Waiter(
                lambda: False,
                lambda timed_out: self._expire(job, arrival, timeout_s),
                time.monotonic() + timeout_s,
            )
            self.scheduler.watch(arrival.waiter)
            return
        self.waiting.pop(key, None)
        self._form(job, waiting)

    def _form(self, job: str, ranks: list[Arrival]) -> None:
        root = ranks[0]
        issuer = root.session.link if isinstance(root.session, RemoteProcess) else root.session
        info = self.collectives.communicators.issue_root_info(
            issuer, root.session.pid, ROOT_DEVICE, root.exec_timeout_s, root.tenant
        )
        key = (root.tenant, job)
        formation = self.formed.pop(key, 0) + 1
        self.formed[key] = formation
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
        log_about(  # the client that completed it: a job of one, formed in a loop, is its
            getattr(ranks[-1].session, "owner", None),  # flood (server/core/rate_limits.py)
            log,
            logging.INFO,
            "job %r (formation %d): %d ranks, pids %s",
            job,
            formation,
            len(ranks),
            [a.session.pid for a in ranks],
        )

    def _expire(self, job: str, arrival: Arrival, timeout_s: float) -> None:
        key = (arrival.tenant, job)
        waiting = self.waiting.get(key, [])
        if arrival not in waiting:
            return
        waiting.remove(arrival)
        if not waiting:
            del self.waiting[key]
        present = [a for a in waiting if not a.session.closed]
        arrival.session.respond(
            arrival.request_id,
            code=ht.HCCL_E_TIMEOUT,
            message=f"job {job!r}: rendezvous timed out after {timeout_s:g} s "
            f"(HCCL_CONNECT_TIMEOUT of {arrival.describe()}): {len(present) + 1} of "
            f"{arrival.world_size} processes had arrived",
        )

    # ==== across hosts: at a member (scheduler) ==================================================
    def forward(self, seed: str, job: str, arrival: Arrival, timeout_s: float) -> None:
        """A local process of `job` waits at the seed daemon `seed` (SIMNPU_JOB_SEED)."""
        worlds = self.collectives.worlds
        if worlds.advertise is None:
            arrival.session.respond(
                arrival.request_id,
                code=ht.HCCL_E_PARA,
                message=f"job {job!r}: SIMNPU_JOB_SEED names the daemon at {seed}; this daemon "
                "joins jobs across hosts only with --advertise (docs/multihost.md)",
            )
            return
        link = self._seeds.get(seed)
        if link is None:
            hello = pb.PeerHello(address=worlds.advertise, jobs=True)
            link = self._seeds[seed] = Outgoing(
                seed,
                worlds.token,
                hello,
                lambda link, message: self.scheduler.call(self._seed_message, message),
                lambda link, reason: self.scheduler.call(self._seed_ended, seed, link, reason),
            )
        forwarded = _Forwarded(seed, arrival, next(self._ids))
        self._forwarded[forwarded.id] = forwarded
        link.send(
            pb.PeerMessage(
                arrive=pb.PeerArrive(
                    id=forwarded.id,
                    job=job,
                    world_size=arrival.world_size,
                    exec_timeout_s=arrival.exec_timeout_s,
                    timeout_s=timeout_s,
                    pid=arrival.session.pid,
                    tenant=arrival.tenant.key,
                )
            )
        )

    def _seed_message(self, message: pb.PeerMessage) -> None:
        if message.WhichOneof("body") != "assigned":
            return
        assigned = message.assigned
        forwarded = self._forwarded.pop(assigned.id, None)
        if forwarded is None:
            return
        arrival = forwarded.arrival
        if assigned.result:
            arrival.session.respond(
                arrival.request_id, code=assigned.result, message=assigned.message
            )
        else:
            arrival.session.respond(arrival.request_id, assigned.reply)

    def _seed_ended(self, seed: str, link: Link, reason: str) -> None:
        if self._seeds.get(seed) is link:
            del self._seeds[seed]
        for key, forwarded in list(self._forwarded.items()):
            if forwarded.seed == seed:
                del self._forwarded[key]
                forwarded.arrival.session.respond(
                    forwarded.arrival.request_id,
                    code=ht.HCCL_E_TCP_CONNECT,
                    message=f"cannot reach the job's seed daemon at {seed} "
                    f"(SIMNPU_JOB_SEED): {reason}",
                )

    def session_closed(self, session: RankSession) -> None:
        """A local process ended: its forwarded arrivals depart from their seeds."""
        for key, forwarded in list(self._forwarded.items()):
            if forwarded.arrival.session is session:
                del self._forwarded[key]
                link = self._seeds.get(forwarded.seed)
                if link is not None:
                    link.send(pb.PeerMessage(depart=pb.PeerDepart(id=key)))

    # ==== across hosts: at the seed ==============================================================
    def accept(self, hello: pb.PeerHello) -> Incoming:
        """A member daemon's stream of forwarded arrivals (on a gRPC thread)."""
        return Incoming(
            hello.address,
            lambda link, message: self.scheduler.call(self._member_message, link, message),
            lambda link, reason: self.scheduler.call(self._member_ended, link),
        )

    def _member_message(self, link: Link, message: pb.PeerMessage) -> None:
        body = message.WhichOneof("body")
        processes = self._remote.setdefault(link, {})
        if body == "arrive":
            arrive = message.arrive
            problem = job_problem(arrive.job, arrive.world_size)
            process = RemoteProcess(link, arrive.id, arrive.pid)
            if problem is not None:
                process.respond(0, code=ht.HCCL_E_PARA, message=problem)
                return
            processes[arrive.id] = process
            tenant = Tenant(arrive.tenant)  # (a member daemon speaks with the operator's token)
            arrival = Arrival(process, 0, arrive.world_size, arrive.exec_timeout_s, tenant)
            self.arrive(arrive.job, arrival, arrive.timeout_s)
        elif body == "depart":
            departed = processes.pop(message.depart.id, None)
            if departed is not None:
                departed.closed = True

    def _member_ended(self, link: Link) -> None:
        for process in self._remote.pop(link, {}).values():
            process.closed = True
        self.collectives.communicators.forget_issuer(link)


def job_problem(job: str, world_size: int) -> str | None:
    """What is wrong with a job's name or world size (HCCL_E_PARA), or None."""
    if not job or len(job) > MAX_JOB_NAME or not job.isprintable():
        return f"the job name must be 1..{MAX_JOB_NAME} printable characters, not {quoted(job)}"
    if not 1 <= world_size <= ht.MAX_RANKS:
        return f"job {job!r}: world size {world_size} is not in [1, {ht.MAX_RANKS}]"
    return None
