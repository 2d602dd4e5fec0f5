"""HCCL worlds across hosts: communicators whose ranks are served by several daemons
(docs/multihost.md).

A root info carries its daemon's advertised address. A rank that joins with another
daemon's root info makes its own daemon a *member* of the world: the daemon opens a Peer
stream (server/hccl/daemon_links.py) to the root info's daemon, the *coordinator*, and forwards
the join. The coordinator counts remote joins in the rendezvous like local ones
(server/hccl/communicators.py). When every rank has joined it numbers the hosts by their
lowest rank and sends the layout to every member; each daemon then makes a
`Communicator` of its own ranks, with the others as `RemoteRank`s, and a `World`.

A World runs each matched collective in three phases, one collective at a time, in the
order of the communicator's keys on every host: the AI cores reduce or gather the
host's ranks into a host block in device memory, the engine processes
(server/hccl/gloo_exchange.py) exchange the blocks between hosts, and the AI cores copy the result
out. Host 0's engine serves the engines' store; its port goes through the coordinator to
every member.

A world breaks on any failure. Failures include a collective that fails on one host (a
mismatch, a timeout, a rank that left or ended), a Peer stream that ends, and an engine
step that fails. The daemon that sees it tells the others, through the coordinator.
Every host then fails the world's pending and future collectives with HCCL_E_REMOTE,
naming what happened.

Everything here runs under the scheduler lock; links and engines report through
`scheduler.call`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from simnpu.proto import codes, service
from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.server.core.streams import Failure
from simnpu.server.core.unit_protocol import Span
from simnpu.server.core.waiters import Waiter
from simnpu.server.hccl.daemon_links import Incoming, Link, Outgoing
from simnpu.server.hccl.failure_codes import MISMATCH, REMOTE, TIMEOUT
from simnpu.server.hccl.gloo_exchange import (
    Engine,
    EngineLost,
    EngineSetup,
    Exchange,
    Formed,
    Gather,
    Match,
    Mismatch,
    Reduce,
    Report,
    Step,
    StepDone,
    StepFailed,
    StoreListening,
    Transfer,
    transfer_tag,
)
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.server.hccl.collective_task import CollectiveTask
    from simnpu.server.hccl.collectives import Call, Collectives, Op
    from simnpu.server.hccl.communicators import Communicator, Member

log = logging.getLogger("simnpu.worlds")

# how long the engines of a formed world may take to join each other (processes that
# import torch, on a busy machine): HCCL's default HCCL_CONNECT_TIMEOUT
ENGINE_FORM_TIMEOUT_S = ht.DEFAULT_CONNECT_TIMEOUT_S
# how long a failed engine waits for a lost host's Peer stream to end (its keepalive timeout)
LINK_GRACE_S = 3.0


class WorldError(Exception):
    """A world cannot be joined or formed: an HcclResult and a message."""

    def __init__(self, result: int, message: str):
        super().__init__(message)
        self.result = result
        self.message = message


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


def store_host(address: str) -> str:
    """The host part of an advertised HOST:PORT, without IPv6 brackets."""
    parsed = service.parse_address(address)
    return parsed.host


# ---- the phases of one collective -----------------------------------------------------------
@dataclass
class Phases:
    """A matched collective's work on this host: groups for the AI cores before and after
    (server/hccl/reduce_plan.py's form), and the engine's steps between. Built by `plan`."""

    block_bytes: int
    before: list
    steps: list[Step]
    after: list


def _even(count: int, itemsize: int, hosts: int) -> tuple:
    bounds = [count * h // hosts * itemsize for h in range(hosts + 1)]
    return tuple(((bounds[h], bounds[h + 1]),) for h in range(hosts))


def _slices(hosts: tuple, size: int) -> tuple:
    return tuple(tuple((r * size, (r + 1) * size) for r in ranks) for _, ranks in hosts)


def plan(world: World, calls: dict[int, Call], block: Span, first_seq: int) -> Phases:
    """The phases of a matched collective; `calls[r]` is local rank r's Call. Its steps
    start with a Match of every host's call."""
    call = next(iter(calls.values()))
    seq = iter(range(first_seq + 1, first_seq + 3))
    phases = _phases(world, call, calls, block, seq)
    phases.steps.insert(0, Match(first_seq, call.describe().encode()))
    return phases


def _phases(world: World, call: Call, calls: dict[int, Call], block: Span, seq) -> Phases:
    kind, count, root, op = call.kind, call.elements, call.root, call.op
    itemsize = ht.ITEM_SIZES.get(call.dtype, 1)
    dtype = ht.DTYPE_NAMES.get(call.dtype, "uint8")
    size = count * itemsize
    mine = sorted(calls)
    sends = [calls[r].send for r in mine]
    recvs = [calls[r].recv for r in mine]
    hosts, host_count = world.hosts, len(world.hosts)
    offset = block.offset
    if kind == ht.HCCL_CMD_BARRIER:
        owners = tuple(((h, h + 1),) for h in range(host_count))
        return Phases(host_count, [], [Gather(next(seq), offset, owners)], [])
    if count == 0:
        return Phases(0, [], [], [])
    n = world.comm.n_ranks
    if kind == ht.HCCL_CMD_ALLREDUCE:
        owners = _even(count, itemsize, host_count)
        return Phases(
            size,
            [(tuple(sends), (block,), count)],
            [Reduce(next(seq), offset, dtype, op, owners), Gather(next(seq), offset, owners)],
            [((block,), tuple(recvs), count)],
        )
    if kind == ht.HCCL_CMD_REDUCE_SCATTER:
        return Phases(
            n * size,
            [(tuple(sends), (block,), n * count)],
            [Reduce(next(seq), offset, dtype, op, _slices(hosts, size))],
            [((block.at(r * size),), (recvs[i],), count) for i, r in enumerate(mine)],
        )
    if kind == ht.HCCL_CMD_ALLGATHER:
        return Phases(
            n * size,
            [((sends[i],), (block.at(r * size),), count) for i, r in enumerate(mine)],
            [Gather(next(seq), offset, _slices(hosts, size))],
            [((block,), tuple(recvs), n * count)],
        )
    root_host = world.host_of(root)
    whole = tuple(((0, size),) if h == root_host else () for h in range(host_count))
    if kind == ht.HCCL_CMD_BROADCAST:  # each rank's buffer is its send
        before = [((calls[root].send,), (block,), count)] if root in calls else []
        others = tuple(s for r, s in zip(mine, sends) if r != root)
        return Phases(
            size,
            before,
            [Gather(next(seq), offset, whole)],
            [((block,), others, count)] if others else [],
        )
    if kind == ht.HCCL_CMD_REDUCE:
        after = [((block,), (calls[root].recv,), count)] if root in calls else []
        return Phases(
            size,
            [(tuple(sends), (block,), count)],
            [Reduce(next(seq), offset, dtype, op, whole)],
            after,
        )
    here = _Here(world, mine, sends, recvs, block, count, size, next(seq))
    if kind == ht.HCCL_CMD_SCATTER:
        return _scatter(here, calls[root].send if root in calls else None, root_host)
    if kind == ht.HCCL_CMD_ALLTOALL:
        return _alltoall(here)
    raise ValueError(f"collective {kind} does not run across hosts")


class _Here(NamedTuple):
    """A collective's facts on this host, for the planners of scatter and alltoall."""

    world: World
    mine: list  # the local ranks, in order
    sends: list  # their send buffers
    recvs: list  # their recv buffers
    block: Span
    elements: int  # per slice
    size: int  # bytes per slice
    seq: int  # the Exchange step's


def _scatter(here: _Here, source: Span | None, root_host: int) -> Phases:
    """scatter, laid out by global rank in the block: the root's host (`source`: the root's
    send buffer) copies its own ranks' slices straight to them and the other hosts' ranks'
    slices into the block, then sends each host its ranks' slices; that host copies them
    out."""
    world, mine, recvs, block, count, size, seq = (
        here.world,
        here.mine,
        here.recvs,
        here.block,
        here.elements,
        here.size,
        here.seq,
    )
    n = world.comm.n_ranks
    if source is not None:
        others = [(h, r) for h, (_, rs) in enumerate(world.hosts) if h != world.host for r in rs]
        before = [((source.at(r * size),), (recvs[i],), count) for i, r in enumerate(mine)]
        before += [((source.at(r * size),), (block.at(r * size),), count) for _, r in others]
        sends = tuple((h, (r * size, (r + 1) * size)) for h, r in others)
        return Phases(n * size, before, [Exchange(seq, block.offset, sends, ())], [])
    receives = tuple((root_host, (r * size, (r + 1) * size)) for r in mine)
    after = [((block.at(r * size),), (recvs[i],), count) for i, r in enumerate(mine)]
    return Phases(n * size, [], [Exchange(seq, block.offset, (), receives)], after)


def _alltoall(here: _Here) -> Phases:
    """alltoall (rank i's slice j to rank j's slice i): slices between this host's ranks
    are copied straight; for each other host g, the block holds what leaves for g ([local
    rank i][g's rank j]) and what comes from g ([g's rank i][local rank j]), each in one
    range, exchanged with g at once."""
    world, mine, sends, recvs, block, count, size = here[:7]
    local = len(mine)
    peers = [(g, ranks) for g, (_, ranks) in enumerate(world.hosts) if g != world.host]
    before = [
        ((sends[a].at(j * size),), (recvs[b].at(i * size),), count)
        for a, i in enumerate(mine)
        for b, j in enumerate(mine)
    ]
    after, out, into, at = [], [], [], 0
    for g, ranks in peers:
        for a in range(local):
            for k, j in enumerate(ranks):
                before.append(
                    ((sends[a].at(j * size),), (block.at(at + (a * len(ranks) + k) * size),), count)
                )
        out.append((g, (at, at + local * len(ranks) * size)))
        at += local * len(ranks) * size
    for g, ranks in peers:
        for k, i in enumerate(ranks):
            for b in range(local):
                after.append(
                    ((block.at(at + (k * local + b) * size),), (recvs[b].at(i * size),), count)
                )
        into.append((g, (at, at + len(ranks) * local * size)))
        at += len(ranks) * local * size
    return Phases(at, before, [Exchange(here.seq, block.offset, tuple(out), tuple(into))], after)


# ---- one world on this host -------------------------------------------------------------------
@dataclass(eq=False)
class World:
    """This daemon's part of a world across hosts: its communicator, the hosts in order,
    the links, the engine and the host block."""

    worlds: Worlds
    comm: Communicator
    hosts: tuple  # ((address, (rank, ...)), ...) in host order
    host: int  # this daemon's index
    exec_timeout_s: float
    links: list[Link]  # coordinator: one per member host; member: the coordinator's
    coordinator: bool
    engine: Engine | None = None
    block_address: int = 0
    block_bytes: int = 0
    device: int = 0  # the device of the host block (the lowest local rank's)
    queue: deque = field(default_factory=deque)  # matched (op, tasks) waiting their turn
    current: tuple | None = None  # (op, tasks, phases) running
    step_seq: int = 0
    waiting_step: int = -1  # the StepDone that ends the current exchange
    broken: str | None = None  # why the world is over here (broken, or destroyed)
    remote_key: tuple | None = None  # at a member: (coordinator address, its comm id)
    unsent: list = field(default_factory=list)  # steps due before the engine started
    left: str | None = None  # another host's ranks all destroyed the communicator
    engine_failure: str | None = None  # the engine failed; the world breaks soon
    engine_reaped: bool = False  # the world is over and its engine process has ended
    transfers: dict = field(default_factory=dict)  # seq -> (op, tasks): sends/recvs in flight
    transfers_failed: tuple | None = None  # (message, outcome) once the engine has stopped

    def host_of(self, rank: int) -> int:
        for index, (_, ranks) in enumerate(self.hosts):
            if rank in ranks:
                return index
        raise ValueError(f"rank {rank} is on no host")

    def here(self) -> str:
        return self.describe_host(self.hosts[self.host][0])

    def describe_host(self, address: str) -> str:
        for _, (host, ranks) in enumerate(self.hosts):
            if host == address:
                listed = ", ".join(map(str, ranks))
                return f"host {address} (rank{'s' if len(ranks) > 1 else ''} {listed})"
        return f"host {address}"

    # ---- the engine -------------------------------------------------------------------------
    def start_engine(self, host: str, port: int) -> None:
        """Start this host's engine process: the store's server at host 0 (port 0)."""
        if self.engine is not None or self.broken is not None:
            return
        device = self.worlds.collectives.devices[self.device]
        setup = EngineSetup(
            self.host,
            len(self.hosts),
            host,
            port,
            device.region.name,
            self.exec_timeout_s,
            ENGINE_FORM_TIMEOUT_S,
            store_host(self.hosts[self.host][0]),
        )
        scheduler = self.worlds.collectives.scheduler
        self.engine = Engine(setup, lambda report: scheduler.call(self._engine_report, report))
        self.engine.start()
        for step in self.unsent:
            self.engine.submit(step)
        self.unsent.clear()

    def _engine_report(self, report: Report) -> None:
        if self.broken is not None:
            return
        if isinstance(report, StoreListening):
            host = store_host(self.hosts[0][0])
            self.worlds.relay_store(self, host, report.port)
        elif isinstance(report, Formed):
            log.info("world of communicator %d: engines formed", self.comm.id)
        elif isinstance(report, StepDone):
            if report.seq in self.transfers:
                self._transfer_done(report.seq)
            elif report.seq == self.waiting_step:
                self._after()
        elif isinstance(report, Mismatch):  # a transfer's calls name their rank
            joint = ": " if report.seq in self.transfers else " called "
            called = "; ".join(
                f"{self.describe_host(address)}{joint}{call.decode(errors='replace')}"
                for (address, _), call in zip(self.hosts, report.calls)
                if call
            )
            title = self._title(report.seq)
            message = f"HCCL mismatch between hosts at {title}: {called}"
            self.worlds.break_world(self, message, MISMATCH)
        elif isinstance(report, StepFailed) and report.silent:
            silent = ", ".join(self.describe_host(self.hosts[h][0]) for h in report.silent)
            self._engine_failed(
                f"{self._title(report.seq)}: {silent} did not take part within "
                f"HCCL_EXEC_TIMEOUT ({self.exec_timeout_s:g} s), seen from {self.here()}",
                TIMEOUT,
            )
        elif isinstance(report, StepFailed):
            self._engine_failed(
                f"the exchange between hosts failed on {self.here()}: {report.message}"
            )
        elif isinstance(report, EngineLost):
            self._engine_failed(
                f"the engine process of {self.here()} ended (exit code {report.exitcode})"
            )

    def _title(self, seq: int) -> str:
        """How messages name what engine step `seq` is part of."""
        if seq in self.transfers:
            return self.comm.title(self.transfers[seq][0].key)
        if self.current is not None:
            return self.comm.title(self.current[0].key)
        return f"communicator {self.comm.id}"

    def _engine_failed(self, message: str, outcome: tuple = REMOTE) -> None:
        """The engine failed. A peer host that died or was cut off fails it too, and its
        Peer stream ends within LINK_GRACE_S: wait that long for the lost host's name, the
        better report, before breaking the world with the engine's message."""
        if self.engine_failure is not None:
            return
        self.engine_failure = message

        def settle(timed_out: bool) -> None:
            self.worlds.break_world(self, message, outcome)

        scheduler = self.worlds.collectives.scheduler
        scheduler.watch(Waiter(lambda: False, settle, time.monotonic() + LINK_GRACE_S))

    # ---- collectives, one at a time ---------------------------------------------------------
    def run(self, op: object, tasks: list[CollectiveTask]) -> None:
        """A collective all local ranks have arrived at: run it after those before it."""
        self.queue.append((op, tasks))
        if self.current is None:
            self._next()

    def _next(self) -> None:
        while self.current is None and self.queue and self.broken is None:
            op, tasks = self.queue.popleft()
            calls = {task.member.rank: task.call for task in tasks}
            block = Span(
                self.worlds.collectives.devices[self.device].region.name,
                split_device_address(self.block_address)[1],
                self.device,
            )
            phases = plan(self, calls, block, self.step_seq)
            if phases.block_bytes > self.block_bytes:
                try:
                    self._grow_block(phases.block_bytes)
                except Exception as error:  # noqa: BLE001 - the device is out of memory
                    self.worlds.break_world(self, f"no device memory for the host block: {error}")
                    return
                block = block._replace(offset=split_device_address(self.block_address)[1])
                phases = plan(self, calls, block, self.step_seq)
            self.step_seq += len(phases.steps)
            self.current = (op, tasks, phases)
            self._before()

    def _grow_block(self, nbytes: int) -> None:
        device = self.worlds.collectives.devices[self.device]
        if self.block_address:
            device.free(self.block_address)
            self.block_address = self.block_bytes = 0
        self.block_address = device.allocate(nbytes, codes.ACL_MEM_MALLOC_HUGE_FIRST, self)
        self.block_bytes = nbytes

    def _before(self) -> None:
        assert self.current is not None
        op, tasks, phases = self.current
        if phases.before:
            self.worlds.collectives.run_groups(self.comm, op, tasks, phases.before, self._exchange)
        else:
            self._exchange(None)

    def _exchange(self, failure: Failure | None) -> None:
        """The host block is ready (or its phase failed): the engine's steps."""
        if self.current is None:
            return
        _, _, phases = self.current
        if failure is not None or self.broken is not None or not phases.steps:
            self._after(failure)
            return
        self.waiting_step = phases.steps[-1].seq
        for step in phases.steps:
            self._submit(step)

    def _submit(self, step: Step) -> None:
        if self.engine is None:  # its store's address has not come yet
            self.unsent.append(step)
        else:
            self.engine.submit(step)

    # ---- sends and receives between hosts, beside the collectives -----------------------------
    def transfer(self, op: Op, task: CollectiveTask) -> None:
        """A local rank's send to, or receive from, a rank on another host (the whole of
        its send/recv key here): the engine moves it straight from or into its buffer."""
        call, n = task.call, self.comm.n_ranks
        _, source, destination, index = op.key
        sending = call.kind == ht.HCCL_CMD_SEND
        span, nbytes = (call.send, call.send_bytes) if sending else (call.recv, call.recv_bytes)
        seq, self.step_seq = self.step_seq, self.step_seq + 1
        self.transfers[seq] = (op, [task])
        self._submit(
            Transfer(
                seq,
                span.segment,
                (span.offset, span.offset + nbytes),
                self.host_of(call.root),
                transfer_tag(source, destination, index, n),
                sending,
                f"{call.elements} {call.dtype}".encode(),
                f"rank {task.member.rank} called {call.describe()}".encode(),
            )
        )

    def _transfer_done(self, seq: int) -> None:
        op, tasks = self.transfers.pop(seq)
        self.worlds.collectives.finish_world_op(self.comm, op, tasks, None)
        self.settle()

    def _after(self, failure: Failure | None = None) -> None:
        """The exchange is done: copy the result out."""
        assert self.current is not None
        op, tasks, phases = self.current
        self.waiting_step = -1
        if phases.after and failure is None and self.broken is None:
            self.worlds.collectives.run_groups(
                self.comm, op, tasks, phases.after, self._finish_current
            )
        else:
            self._finish_current(failure)

    def _finish_current(self, failure: Failure | None) -> None:
        if self.current is None:
            return
        op, tasks, _ = self.current
        self.current = None
        collectives = self.worlds.collectives
        if failure is not None:
            message = f"its data movement failed: {failure.message}"
            collectives.finish_world_op(self.comm, op, tasks, message)
            self.worlds.break_world(self, f"on {self.here()}: {message}")
            return
        collectives.finish_world_op(self.comm, op, tasks, self.broken)
        if self.broken is not None:  # it broke while the AI cores ran this phase
            self._free_block_if_idle()
            return
        if self.left is None:
            self._next()
        self.settle()

    def busy(self) -> bool:
        return self.current is not None or bool(self.queue) or bool(self.transfers)

    def settle(self) -> None:
        """Nothing runs here: the world is over if another host's ranks left, or every local
        rank destroyed the communicator."""
        if self.busy() or self.broken is not None:
            return
        if self.left is not None:
            self.worlds.world_over(self)
        elif all(m.state in ("destroyed", "gone") for m in self.comm.local_members()):
            self.worlds.communicator_done(self.comm)

    def fail_queued(self, message: str, outcome: tuple) -> None:
        """The world broke: every collective it holds fails (one running on AI cores fails
        when they report)."""
        held = list(self.queue)
        self.queue.clear()
        if self.current is not None and self.waiting_step >= 0:  # in the engine: never ends
            op, tasks, _ = self.current
            self.current = None
            self.waiting_step = -1
            held.append((op, tasks))
        for op, tasks in held:
            self.worlds.collectives.finish_world_op(self.comm, op, tasks, message, outcome)
        self.transfers_failed = (message, outcome)
        if self.engine is None:  # their steps never left this daemon
            self._fail_transfers()

    def _fail_transfers(self) -> None:
        """The sends/recvs in flight fail, once no engine process can touch their buffers."""
        if self.transfers_failed is None:
            return
        message, outcome = self.transfers_failed
        held, self.transfers = list(self.transfers.values()), {}
        for op, tasks in held:
            self.worlds.collectives.finish_world_op(self.comm, op, tasks, message, outcome)

    def release(self, graceful: bool) -> None:
        """The world is over here: close its links, stop the engine (`graceful`: once its
        last step is done; else at once), and give the host block back once neither the
        engine process nor the AI cores can write it any more. Does not wait."""
        for link in self.links:
            link.close()
        engine, self.engine = self.engine, None
        if engine is None:
            self.engine_reaped = True
            self._free_block_if_idle()
            return
        scheduler = self.worlds.collectives.scheduler

        def stop() -> None:
            engine.stop(graceful)
            scheduler.call(self._engine_stopped)

        threading.Thread(target=stop, name="simnpu-engine-stop", daemon=True).start()

    def _engine_stopped(self) -> None:
        self.engine_reaped = True
        self._fail_transfers()
        self._free_block_if_idle()

    def _free_block_if_idle(self) -> None:
        """Give the host block back, if the world is over and nothing writes it any more."""
        if self.broken is None or not self.engine_reaped or self.current is not None:
            return
        if self.worlds.stopped:  # the device's memory goes with the daemon
            self.block_address = self.block_bytes = 0
            return
        if self.block_address:
            self.worlds.collectives.devices[self.device].free(self.block_address)
            self.block_address = self.block_bytes = 0


# ---- every world of this daemon -----------------------------------------------------------------
@dataclass(eq=False)
class _Joining:
    """At a member: this daemon's ranks waiting in a world's rendezvous at a coordinator."""

    coordinator: str
    comm_id: int
    link: Link
    cluster: bool  # joined with a rank table (HcclCommInitClusterInfo), not a root info
    members: dict = field(default_factory=dict)  # rank -> (Member, request id)


class Worlds:
    """The worlds across hosts this daemon takes part in (scheduler-owned)."""

    def __init__(self, collectives: Collectives):
        self.collectives = collectives
        self.advertise: str | None = None  # set by the daemon: --advertise
        self.token: str = ""
        self._joining: dict[tuple, _Joining] = {}  # (coordinator, comm id or table key) ->
        self._incoming: dict[int, list[Link]] = {}  # comm id -> member links (coordinator)
        self._comm_of: dict[Link, int] = {}  # a member link -> the comm id it joins
        self._tables: dict[Link, bytes] = {}  # a member link -> its rank table's key
        self.formed: dict[int, World] = {}  # local communicator id -> its world
        self.stopped = False  # the daemon stops: device memory goes with it

    @property
    def communicators(self):
        return self.collectives.communicators

    def _call(self, function: Callable, *args: object) -> None:
        self.collectives.scheduler.call(function, *args)

    # ---- at a member --------------------------------------------------------------------------
    def join_remote(
        self,
        member: Member,
        coordinator: str,
        nonce: bytes,
        connect_timeout_s: float,
        request_id: int,
        table_key: bytes = b"",
        exec_timeout_s: float = 0.0,
    ) -> None:
        """A local rank joins a world that forms at another daemon: the root info's, or
        (`table_key`) the first server's of a rank table."""
        if self.advertise is None:
            raise WorldError(
                ht.HCCL_E_PARA,
                f"the root info was issued by the daemon at {coordinator}; this daemon takes "
                "part in worlds across hosts only with --advertise (docs/multihost.md)",
            )
        key = (coordinator, table_key or member.comm_id)
        joining = self._joining.get(key)
        if joining is None:
            hello = pb.PeerHello(
                comm_id=member.comm_id, nonce=nonce, address=self.advertise, table_key=table_key
            )
            link = Outgoing(
                coordinator,
                self.token,
                hello,
                lambda link, message: self._call(self._member_message, key, message),
                lambda link, reason: self._call(self._member_link_ended, key, reason),
            )
            joining = self._joining[key] = _Joining(
                coordinator, member.comm_id, link, cluster=bool(table_key)
            )
        joining.members[member.rank] = (member, request_id)
        join = pb.PeerJoin(
            rank=member.rank,
            n_ranks=member.n_ranks,
            device=member.device,
            pid=getattr(member.session, "pid", 0),
            connect_timeout_s=connect_timeout_s,
        )
        if table_key and member.rank == 0:
            join.exec_timeout_s = exec_timeout_s
        joining.link.send(pb.PeerMessage(join=join))

    def _member_message(self, key: tuple, message: pb.PeerMessage) -> None:
        joining = self._joining.get(key)
        world = None if joining is not None else self._world_of_link(key)
        body = message.WhichOneof("body")
        if joining is not None:
            if body == "formed":
                self._member_formed(key, joining, message.formed)
            elif body == "failed":
                self._member_rejected(key, joining, message.failed)
            return
        if world is None:
            return
        if body == "store":
            world.start_engine(message.store.host, message.store.port)
        elif body == "failed":
            failed = message.failed
            self.break_world(world, failed.message, _outcome(failed.result), tell=False)
        elif body == "left":
            self.host_left(world, message.left.message)

    def _world_of_link(self, key: tuple) -> World | None:
        for world in self.formed.values():
            if world.remote_key == key:
                return world
        return None

    def _member_formed(self, key, joining: _Joining, formed: pb.PeerFormed) -> None:
        del self._joining[key]
        hosts = tuple((h.address, tuple(h.ranks)) for h in formed.hosts)
        members = [member for member, _ in joining.members.values()]
        n_ranks = members[0].n_ranks
        host = next(i for i, (address, _) in enumerate(hosts) if address == self.advertise)
        world_members: list = [None] * n_ranks
        for address, ranks in hosts:
            for rank in ranks:
                world_members[rank] = RemoteRank(
                    rank, n_ranks, -1, 0, address, joining.comm_id, state="ready"
                )
        for member in members:
            world_members[member.rank] = member
        reply_type = pb.HcclCommInitClusterReply if joining.cluster else pb.HcclCommInitReply
        comm = self.communicators.form_world_communicator(
            world_members, formed.exec_timeout_s, joining.members.values(), reply_type
        )
        world = World(
            self,
            comm,
            hosts,
            host,
            formed.exec_timeout_s,
            [joining.link],
            coordinator=False,
            remote_key=key,
        )
        self._attach(world, members)

    def _member_rejected(self, key, joining: _Joining, failed: pb.PeerFailed) -> None:
        if failed.HasField("rank"):
            entry = joining.members.pop(failed.rank, None)
            if entry is not None:
                self.communicators.reject(entry[0], entry[1], failed.result, failed.message)
            if joining.members:
                return
        del self._joining[key]
        joining.link.close()
        for member, request_id in joining.members.values():
            self.communicators.reject(member, request_id, failed.result, failed.message)

    def _member_link_ended(self, key: tuple, reason: str) -> None:
        joining = self._joining.pop(key, None)
        if joining is not None:
            for member, request_id in joining.members.values():
                self.communicators.reject(
                    member,
                    request_id,
                    ht.HCCL_E_TCP_CONNECT,
                    f"cannot reach the daemon at {key[0]}, where the world forms (the root "
                    f"info's daemon, or that of the rank table's first server): {reason}",
                )
            return
        world = self._world_of_link(key)
        if world is not None and world.left is None:  # (after a PeerLeft the stream ends)
            self.break_world(
                world,
                f"lost the coordinator, {world.describe_host(key[0])}: {reason}",
                tell=False,
            )

    def member_left(self, member: Member) -> None:
        """A joining local rank's session ended: the world cannot form."""
        for key, joining in list(self._joining.items()):
            if joining.members.get(member.rank, (None,))[0] is member:
                joining.link.send(
                    pb.PeerMessage(
                        failed=pb.PeerFailed(
                            result=ht.HCCL_E_REMOTE,
                            message=f"{member.describe()} on host {self.advertise} ended before "
                            f"every rank joined communicator {member.comm_id}",
                        )
                    )
                )
                del joining.members[member.rank]

    # ---- at the coordinator ------------------------------------------------------------------
    def accept(self, hello: pb.PeerHello) -> Incoming:
        """A member daemon's Peer stream (on a gRPC thread): its link."""
        link = Incoming(
            hello.address,
            lambda link, message: self._call(self._coordinator_message, link, message),
            lambda link, reason: self._call(self._coordinator_link_ended, link, reason),
        )
        self._call(self._accepted, link, hello)
        return link

    def _accepted(self, link: Link, hello: pb.PeerHello) -> None:
        if hello.table_key:  # its rendezvous: the table's open one, else a new one
            comm_id = self.communicators.table_comm_id(hello.table_key, 0, 0)
            self._tables[link] = hello.table_key
        else:
            comm_id = hello.comm_id
            problem = self.communicators.remote_problem(comm_id, hello.nonce)
            if problem is not None:
                failed = pb.PeerFailed(result=problem[0], message=problem[1])
                link.send(pb.PeerMessage(failed=failed))
                link.close()
                return
        self._comm_of[link] = comm_id
        self._incoming.setdefault(comm_id, []).append(link)

    def _coordinator_message(self, link: Link, message: pb.PeerMessage) -> None:
        body = message.WhichOneof("body")
        world = self._world_of_incoming(link)
        comm_id = self._comm_of.get(link)
        if body == "join" and world is None and comm_id is not None:
            join = message.join
            remote = RemoteRank(
                join.rank, join.n_ranks, join.device, join.pid, link.address, comm_id, link
            )
            table_key = self._tables.get(link)
            if table_key is None:
                self.communicators.join_remote(remote, join.connect_timeout_s)
            else:
                self.communicators.join_remote_table(
                    remote, table_key, join.connect_timeout_s, join.exec_timeout_s
                )
        elif body == "failed":
            failed = message.failed
            if world is not None:
                self.break_world(world, failed.message, _outcome(failed.result), origin=link)
            elif comm_id is not None:
                self.communicators.fail_open(comm_id, failed.result, failed.message)
        elif body == "store" and world is not None:
            self.relay_store(world, message.store.host, message.store.port, origin=link)
        elif body == "left" and world is not None:
            self.host_left(world, message.left.message, origin=link)

    def _world_of_incoming(self, link: Link) -> World | None:
        for world in self.formed.values():
            if world.coordinator and link in world.links:
                return world
        return None

    def _coordinator_link_ended(self, link: Link, reason: str) -> None:
        comm_id = self._comm_of.pop(link, None)
        self._tables.pop(link, None)
        world = self._world_of_incoming(link)
        if world is not None:
            if world.left is None:  # (after a PeerLeft the stream ends)
                self.break_world(world, f"lost {world.describe_host(link.address)}: {reason}")
            return
        links = self._incoming.get(comm_id) if comm_id is not None else None
        if comm_id is not None and links is not None and link in links:
            links.remove(link)
            self.communicators.fail_open(
                comm_id,
                ht.HCCL_E_REMOTE,
                f"lost host {link.address} before every rank joined communicator {comm_id}: "
                f"{reason}",
                host=link.address,
            )

    def reject_remote(self, remote: RemoteRank, result: int, message: str) -> None:
        """A remote rank's join failed at the coordinator (the rendezvous, or the rank)."""
        if remote.link is not None:
            remote.link.send(
                pb.PeerMessage(
                    failed=pb.PeerFailed(result=result, message=message, rank=remote.rank)
                )
            )

    def coordinator_formed(
        self, comm: Communicator, exec_timeout_s: float, host_order: tuple = ()
    ) -> None:
        """The coordinator's rendezvous formed with remote ranks: lay the hosts out (in
        `host_order`, a rank table's server order, else by their lowest rank), tell the
        members, and make this daemon's world."""
        assert self.advertise is not None
        by_host: dict[str, list[int]] = {}
        for member in comm.members:
            address = member.host if isinstance(member, RemoteRank) else self.advertise
            by_host.setdefault(address, []).append(member.rank)

        def place(host: tuple) -> tuple:
            address, ranks = host
            return (host_order.index(address) if address in host_order else -1, ranks[0])

        hosts = tuple(sorted(((a, tuple(sorted(r))) for a, r in by_host.items()), key=place))
        links: dict[str, Link] = {}
        for member in comm.members:
            if isinstance(member, RemoteRank) and member.link is not None:
                links[member.host] = member.link
        formed = pb.PeerFormed(
            hosts=[pb.PeerHost(address=a, ranks=list(r)) for a, r in hosts],
            exec_timeout_s=exec_timeout_s,
        )
        for link in links.values():
            link.send(pb.PeerMessage(formed=formed))
        for link in self._incoming.pop(comm.id, []):
            self._comm_of.pop(link, None)
            self._tables.pop(link, None)
            if link not in links.values():  # a member whose ranks were all refused
                link.close()
        host = next(i for i, (address, _) in enumerate(hosts) if address == self.advertise)
        world = World(
            self, comm, hosts, host, exec_timeout_s, list(links.values()), coordinator=True
        )
        self._attach(world, [m for m in comm.members if not isinstance(m, RemoteRank)])

    def rendezvous_ended(self, comm_id: int) -> None:
        """A rendezvous failed at the coordinator: its member links close."""
        for link in self._incoming.pop(comm_id, []):
            self._comm_of.pop(link, None)
            self._tables.pop(link, None)
            link.close()

    # ---- both -----------------------------------------------------------------------------
    def _attach(self, world: World, members: list) -> None:
        world.comm.world = world
        world.device = min(members, key=lambda m: m.rank).device
        self.formed[world.comm.id] = world
        if world.host == 0:
            world.start_engine(store_host(world.hosts[0][0]), 0)

    def relay_store(self, world: World, host: str, port: int, origin: Link | None = None) -> None:
        """Where the engines' store listens: passed on to the other hosts, then used here."""
        message = pb.PeerMessage(store=pb.PeerStore(host=host, port=port))
        for link in world.links:
            if link is not origin:
                link.send(message)
        world.start_engine(host, port)

    def break_world(
        self,
        world: World,
        message: str,
        outcome: tuple = REMOTE,
        tell: bool = True,
        origin: Link | None = None,
    ) -> None:
        """The world is broken: tell the other hosts (through the coordinator), fail what
        it holds with `outcome` (MISMATCH or REMOTE) and every later collective with
        REMOTE, stop its engine."""
        if world.broken is not None:
            return
        world.broken = message
        log.info("world of communicator %d broken: %s", world.comm.id, message)
        if tell or world.coordinator:
            failed = pb.PeerMessage(failed=pb.PeerFailed(result=outcome[1], message=message))
            for link in world.links:
                if link is not origin:
                    link.send(failed)
        world.fail_queued(message, outcome)
        self.collectives.break_communicator(world.comm, message)
        world.release(graceful=False)
        self.formed.pop(world.comm.id, None)

    def host_left(self, world: World, message: str, origin: Link | None = None) -> None:
        """Every rank of another host destroyed the communicator: what runs here finishes,
        nothing starts after it."""
        if world.broken is not None or world.left is not None:
            return
        world.left = message
        if world.coordinator:
            for link in world.links:
                if link is not origin:
                    link.send(pb.PeerMessage(left=pb.PeerLeft(message=message)))
        held = list(world.queue)
        world.queue.clear()
        for op, tasks in held:
            self.collectives.finish_world_op(world.comm, op, tasks, message)
        self.collectives.break_communicator(world.comm, message)
        world.settle()

    def communicator_done(self, comm: Communicator) -> None:
        """Every local rank of a world's communicator destroyed it or ended, and it runs
        nothing: tell the other hosts; the world is over here."""
        world = self.formed.get(comm.id)
        if world is None or world.broken is not None or world.busy():
            return
        if world.left is None:
            message = f"every rank of {world.here()} destroyed communicator {comm.id}"
            for link in world.links:
                link.send(pb.PeerMessage(left=pb.PeerLeft(message=message)))
        self.world_over(world)

    def world_over(self, world: World) -> None:
        """The world ran its last collective here: its engine ends once that is done."""
        world.broken = world.left or "the communicator was destroyed"
        world.release(graceful=True)
        self.formed.pop(world.comm.id, None)

    def stop(self) -> None:
        """The daemon stops: every world here ends (and worlds whose engines are still
        ending leave their host blocks to go with the device memory)."""
        self.stopped = True
        for world in list(self.formed.values()):
            world.broken = "the daemon stopped"
            world.release(graceful=False)
        self.formed.clear()
        for joining in self._joining.values():
            joining.link.close()
        self._joining.clear()


def _outcome(result: int) -> tuple:
    """The (ACL code, HcclResult) that a relayed failure's HcclResult stands for."""
    return {MISMATCH[1]: MISMATCH, TIMEOUT[1]: TIMEOUT}.get(result, REMOTE)
