"""The daemon's side of an engine process: the exchange between the hosts of an HCCL world.

A world across hosts runs each collective in three phases (docs/multihost.md): the AI
cores reduce or gather the host's own ranks into a *host block* in device memory, the
hosts exchange their blocks, and the AI cores copy the result out. The middle phase is
the engine's: one engine process per world on each host, all of them joined through
Gloo (torch.distributed), started, fed and stopped by an `Engine` here. This module does
not import torch; the engine process (server/engine_main.py) is the only one that does.

A collective's exchange starts with a `Match` of every host's call, then moves data in
steps over ranges of the host block that each host *owns* (the same ranges, relative to
the block, on every host):

  Reduce  every host ends with its own ranges reduced over all hosts, in host order
          (host 0's data first); the other ranges are left as they were
  Gather  every host's own ranges are copied into the same ranges of every other host

so all_reduce is a Reduce then a Gather over ranges cut evenly, reduce_scatter a Reduce
over each host's ranks' slices, all_gather a Gather of them, broadcast a Gather that the
root's host owns whole, and reduce a Reduce that it owns whole. `Send` and `Recv` move
one range to or from one other host. Between hosts everything is point-to-point, and the
reduction is numpy's in the fixed order, never the engine's own.

An engine runs one step at a time, in the order submitted. A step's failure (a peer lost,
a step not answered within the world's timeout) ends the engine process: a Gloo group
that lost a peer cannot be used again. `on_report` then gets the `StepFailed` and, when
the process has ended, `EngineLost`.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

Range = tuple[int, int]  # [first byte, end byte) relative to the host block


@dataclass(frozen=True)
class EngineSetup:
    """What an engine process needs to join its world's other hosts."""

    host: int  # this host's index in the world's host order
    hosts: int
    store_host: str  # where the world's TCPStore listens (the first host's engine hosts it)
    store_port: int  # 0 at the first host: its engine starts the store on a free port
    segment: str  # the device-memory segment (POSIX shm name) the host blocks live in
    timeout_s: float  # each step: the world's HCCL_EXEC_TIMEOUT
    form_timeout_s: float  # joining the other hosts' engines (their processes start slowly)
    bind_host: str = ""  # the address Gloo listens on: this daemon's advertised host


@dataclass(frozen=True)
class Reduce:
    """Each host's owned ranges reduced over every host, in host order."""

    seq: int
    block: int  # the host block's offset in this host's segment
    dtype: str  # a numpy dtype name ("bfloat16" included)
    op: int  # HcclReduceOp
    owners: tuple[tuple[Range, ...], ...]  # owners[h]: host h's ranges


@dataclass(frozen=True)
class Gather:
    """Each host's owned ranges copied into the same ranges of every other host."""

    seq: int
    block: int
    owners: tuple[tuple[Range, ...], ...]


@dataclass(frozen=True)
class Match:
    """Every host's `call` (what its ranks called, MATCH_BYTES at most) compared before a
    collective's data moves: `Mismatch` if they differ."""

    seq: int
    call: bytes


@dataclass(frozen=True)
class Send:
    """One range of this host's block to one other host's matching `Recv` (same tag)."""

    seq: int
    block: int
    span: Range
    peer: int
    tag: int


@dataclass(frozen=True)
class Recv:
    """One range of this host's block from one other host's matching `Send`."""

    seq: int
    block: int
    span: Range
    peer: int
    tag: int


@dataclass(frozen=True)
class Finish:
    """No more steps: the engine process ends once the steps before are done."""


Step = Match | Reduce | Gather | Send | Recv
MATCH_BYTES = 256


@dataclass(frozen=True)
class StoreListening:
    """The first host's engine started the world's TCPStore on this port."""

    port: int


@dataclass(frozen=True)
class Formed:
    """Every host's engine has joined the world."""


@dataclass(frozen=True)
class StepDone:
    seq: int


@dataclass(frozen=True)
class Mismatch:
    """A `Match` found calls that differ: calls[h] is host h's. The engine goes on."""

    seq: int
    calls: tuple[bytes, ...]


@dataclass(frozen=True)
class StepFailed:
    """A step (or, with seq -1, forming the world) failed; the engine process ends."""

    seq: int
    message: str


@dataclass(frozen=True)
class EngineLost:
    """The engine process has ended (its pipe closed), for whatever reason."""

    exitcode: int | None


Report = StoreListening | Formed | StepDone | Mismatch | StepFailed | EngineLost

_SPAWN = multiprocessing.get_context("spawn")


class Engine:
    """One world's engine process on this host. `start` returns at once; what the process
    does comes to `on_report`, called from this engine's reader thread: `StoreListening`
    (first host only), `Formed`, then one `StepDone` or `StepFailed` per step, and last
    `EngineLost`. Steps may be submitted before the world has formed; they run after."""

    def __init__(self, setup: EngineSetup, on_report: Callable[[Report], None]):
        self.setup = setup
        self._on_report = on_report
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Spawn the engine process. Does not wait for it to form the world."""
        from simnpu.server import engine_main  # light: torch is imported in the child

        ours, theirs = _SPAWN.Pipe()
        self._process = _SPAWN.Process(
            target=engine_main.main, args=(theirs, self.setup), name="simnpu-engine", daemon=True
        )
        self._process.start()
        theirs.close()
        self._conn = ours
        threading.Thread(target=self._read, name="simnpu-engine-reports", daemon=True).start()

    def submit(self, step: Step) -> None:
        """Hand the engine one step; never blocks on the exchange. A step submitted after
        the process has ended is dropped: its `EngineLost` has come or is coming."""
        assert self._conn is not None, "Engine.start first"
        with self._send_lock:
            try:
                self._conn.send(step)
            except OSError:
                pass

    def stop(self, graceful: bool = False, timeout_s: float = 5.0) -> None:
        """End the engine process and reap it; blocks until it has ended. `graceful`: after
        the steps submitted (a peer may still be reading what they sent), killed if that
        takes `timeout_s`; else at once, abandoning a step in flight."""
        process = self._process
        if process is None:
            return
        if graceful and process.is_alive():
            assert self._conn is not None
            with self._send_lock:
                try:
                    self._conn.send(Finish())
                except OSError:
                    pass
            process.join(timeout_s)
        if process.is_alive():
            process.kill()
        process.join(timeout_s)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _read(self) -> None:
        assert self._conn is not None and self._process is not None
        conn = self._conn
        while True:
            try:
                report = conn.recv()
            except (EOFError, OSError):
                break
            self._on_report(report)
        conn.close()
        self._process.join()
        self._on_report(EngineLost(self._process.exitcode))
