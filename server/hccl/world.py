"""A world across hosts on this daemon: its state, and how it runs its collectives and
breaks (docs/multihost.md).

A `World` is this daemon's part of a communicator whose ranks several daemons serve
(formed by server/hccl/world_membership.py). It runs each matched collective in three
phases, one collective at a time, in the order of the communicator's keys on every host:
the AI cores reduce or gather the host's ranks into a host block in device memory, the
Gloo exchange processes (server/hccl/gloo_exchange.py) exchange the blocks between hosts,
and the AI cores copy the result out (server/hccl/world_plan.py plans the three). A
send/recv with a rank on another host is a Transfer, run by the exchange beside the
collectives. Host 0's exchange process serves the exchange's store; its port goes through
the coordinator to every member.

A world breaks on any failure: a collective that fails on one host (a mismatch, a
timeout, a rank that left or ended), a Peer stream that ends, an exchange step that
fails. It then fails its pending and future collectives with HCCL_E_REMOTE, naming what
happened (Worlds.break_world tells the other hosts), stops its exchange process and gives
its host block back once nothing can write it.

Everything here runs under the scheduler lock; the exchange process reports through
`scheduler.call`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes, service
from simnpu.proto import hccl_types as ht
from simnpu.server.core.streams import Failure
from simnpu.server.core.unit_protocol import Span
from simnpu.server.core.waiters import Waiter
from simnpu.server.hccl.daemon_links import Link
from simnpu.server.hccl.failure_codes import MISMATCH, REMOTE, TIMEOUT
from simnpu.server.hccl.gloo_exchange import ExchangeProcess
from simnpu.server.hccl.gloo_exchange_protocol import (
    ExchangeLost,
    ExchangeSetup,
    Formed,
    Mismatch,
    Report,
    Step,
    StepDone,
    StepFailed,
    StoreListening,
    Transfer,
    transfer_tag,
)
from simnpu.server.hccl.world_plan import Hosts, host_of, plan
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.server.hccl.collective_task import CollectiveTask
    from simnpu.server.hccl.collectives import Op
    from simnpu.server.hccl.communicators import Communicator
    from simnpu.server.hccl.world_membership import Worlds

log = logging.getLogger("simnpu.worlds")

# how long the exchange processes of a formed world may take to join each other (processes
# that import torch, on a busy machine): HCCL's default HCCL_CONNECT_TIMEOUT
EXCHANGE_FORM_TIMEOUT_S = ht.DEFAULT_CONNECT_TIMEOUT_S
# how long a world whose exchange failed waits for a lost host's Peer stream to end (its
# keepalive timeout)
LINK_GRACE_S = 3.0


def store_host(address: str) -> str:
    """The host part of an advertised HOST:PORT, without IPv6 brackets."""
    parsed = service.parse_address(address)
    return parsed.host


@dataclass(eq=False)
class World:
    """This daemon's part of a world across hosts: its communicator, the hosts in order,
    the links, the exchange process and the host block."""

    worlds: Worlds
    comm: Communicator
    hosts: Hosts  # ((address, (rank, ...)), ...) in host order
    host: int  # this daemon's index
    exec_timeout_s: float
    links: list[Link]  # coordinator: one per member host; member: the coordinator's
    coordinator: bool
    exchange: ExchangeProcess | None = None
    block_address: int = 0
    block_bytes: int = 0
    device: int = 0  # the device of the host block (the lowest local rank's)
    queue: deque = field(default_factory=deque)  # matched (op, tasks) waiting their turn
    current: tuple | None = None  # (op, tasks, phases) running
    step_seq: int = 0
    waiting_step: int = -1  # the StepDone that ends the current exchange
    broken: str | None = None  # why the world is over here (broken, or destroyed)
    remote_key: tuple | None = None  # at a member: (coordinator address, its comm id)
    unsent: list = field(default_factory=list)  # steps due before the exchange process started
    left: str | None = None  # another host's ranks all destroyed the communicator
    exchange_failure: str | None = None  # the exchange failed; the world breaks soon
    exchange_reaped: bool = False  # the world is over and its exchange process has ended
    transfers: dict = field(default_factory=dict)  # seq -> (op, tasks): sends/recvs in flight
    transfers_failed: tuple | None = None  # (message, outcome) once the exchange process stopped

    def here(self) -> str:
        return self.describe_host(self.hosts[self.host][0])

    def describe_host(self, address: str) -> str:
        for _, (host, ranks) in enumerate(self.hosts):
            if host == address:
                listed = ", ".join(map(str, ranks))
                return f"host {address} (rank{'s' if len(ranks) > 1 else ''} {listed})"
        return f"host {address}"

    # ---- the exchange process ---------------------------------------------------------------
    def start_exchange(self, host: str, port: int) -> None:
        """Start this host's exchange process: the store's server at host 0 (port 0)."""
        if self.exchange is not None or self.broken is not None:
            return
        device = self.worlds.collectives.devices[self.device]
        setup = ExchangeSetup(
            self.host,
            len(self.hosts),
            host,
            port,
            device.region.name,
            self.exec_timeout_s,
            EXCHANGE_FORM_TIMEOUT_S,
            store_host(self.hosts[self.host][0]),
        )
        scheduler = self.worlds.collectives.scheduler
        self.exchange = ExchangeProcess(
            setup, lambda report: scheduler.call(self._exchange_report, report), device.backing.log
        )
        self.exchange.start()
        for step in self.unsent:
            self.exchange.submit(step)
        self.unsent.clear()

    def _exchange_report(self, report: Report) -> None:
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
            self._exchange_failed(
                f"{self._title(report.seq)}: {silent} did not take part within "
                f"HCCL_EXEC_TIMEOUT ({self.exec_timeout_s:g} s), seen from {self.here()}",
                TIMEOUT,
            )
        elif isinstance(report, StepFailed):
            self._exchange_failed(
                f"the exchange between hosts failed on {self.here()}: {report.message}"
            )
        elif isinstance(report, ExchangeLost):
            self._exchange_failed(
                f"the engine process of {self.here()} ended (exit code {report.exitcode})"
            )

    def _title(self, seq: int) -> str:
        """How messages name what exchange step `seq` is part of."""
        if seq in self.transfers:
            return self.comm.title(self.transfers[seq][0].key)
        if self.current is not None:
            return self.comm.title(self.current[0].key)
        return f"communicator {self.comm.id}"

    def _exchange_failed(self, message: str, outcome: tuple = REMOTE) -> None:
        """The exchange failed. A peer host that died or was cut off fails it too, and its
        Peer stream ends within LINK_GRACE_S: wait that long for the lost host's name, the
        better report, before breaking the world with the exchange's message."""
        if self.exchange_failure is not None:
            return
        self.exchange_failure = message

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
            phases = plan(self.hosts, self.host, calls, block, self.step_seq)
            if phases.block_bytes > self.block_bytes:
                try:
                    self._grow_block(phases.block_bytes)
                except Exception as error:  # noqa: BLE001 - the device is out of memory
                    self.worlds.break_world(self, f"no device memory for the host block: {error}")
                    return
                block = block._replace(offset=split_device_address(self.block_address)[1])
                phases = plan(self.hosts, self.host, calls, block, self.step_seq)
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
        """Reduce or gather the local ranks into the host block."""
        assert self.current is not None
        self._on_cores(self.current[2].before, self._exchange_blocks)

    def _on_cores(self, groups: list, then: Callable, failure: Failure | None = None) -> None:
        """Run a phase's `groups` on the AI cores of the current collective's ranks, then
        `then(failure or None)`; with no groups, a failure before or a broken world, `then`
        at once."""
        assert self.current is not None
        op, tasks, _ = self.current
        if groups and failure is None and self.broken is None:
            self.worlds.collectives.run_groups(self.comm, op, tasks, groups, then)
        else:
            then(failure)

    def _exchange_blocks(self, failure: Failure | None) -> None:
        """The host block is ready (or its phase failed): the exchange's steps."""
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
        if self.exchange is None:  # its store's address has not come yet
            self.unsent.append(step)
        else:
            self.exchange.submit(step)

    # ---- sends and receives between hosts, beside the collectives -----------------------------
    def transfer(self, op: Op, task: CollectiveTask) -> None:
        """A local rank's send to, or receive from, a rank on another host (the whole of
        its send/recv key here): the exchange moves it straight from or into its buffer."""
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
                host_of(self.hosts, call.root),
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
        self.waiting_step = -1
        self._on_cores(self.current[2].after, self._finish_current, failure)

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
        if self.current is not None and self.waiting_step >= 0:  # in the exchange: never ends
            op, tasks, _ = self.current
            self.current = None
            self.waiting_step = -1
            held.append((op, tasks))
        for op, tasks in held:
            self.worlds.collectives.finish_world_op(self.comm, op, tasks, message, outcome)
        self.transfers_failed = (message, outcome)
        if self.exchange is None:  # their steps never left this daemon
            self._fail_transfers()

    def _fail_transfers(self) -> None:
        """The sends/recvs in flight fail, once no exchange process can touch their buffers."""
        if self.transfers_failed is None:
            return
        message, outcome = self.transfers_failed
        held, self.transfers = list(self.transfers.values()), {}
        for op, tasks in held:
            self.worlds.collectives.finish_world_op(self.comm, op, tasks, message, outcome)

    def release(self, graceful: bool) -> None:
        """The world is over here: close its links, stop the exchange process (`graceful`:
        once its last step is done; else at once), and give the host block back once neither
        the exchange process nor the AI cores can write it any more. Does not wait."""
        for link in self.links:
            link.close()
        exchange, self.exchange = self.exchange, None
        if exchange is None:
            self.exchange_reaped = True
            self._free_block_if_idle()
            return
        scheduler = self.worlds.collectives.scheduler

        def stop() -> None:
            exchange.stop(graceful)
            scheduler.call(self._exchange_stopped)

        threading.Thread(target=stop, name="simnpu-engine-stop", daemon=True).start()

    def _exchange_stopped(self) -> None:
        self.exchange_reaped = True
        self._fail_transfers()
        self._free_block_if_idle()

    def _free_block_if_idle(self) -> None:
        """Give the host block back, if the world is over and nothing writes it any more."""
        if self.broken is None or not self.exchange_reaped or self.current is not None:
            return
        if self.worlds.stopped:  # the device's memory goes with the daemon
            self.block_address = self.block_bytes = 0
            return
        if self.block_address:
            self.worlds.collectives.devices[self.device].free(self.block_address)
            self.block_address = self.block_bytes = 0
