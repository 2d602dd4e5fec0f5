"""Kernel module loads (aclrtBinaryLoadFromFile / FromData): each client's at a rate, and
every client's parses served in turn, so that clients loading large modules in a loop
cannot make another client's small load wait for seconds (docs/client-bounds.md).

The parse is what costs (server/kernels/discovery.py: about 1.5 s of a CPU for 1 MiB of
source, 0.04 s for a tiny module, mostly the parser's start). Hence:

* **a rate per client** (its peer, server/control/credentials.py: every session of one
  process together): a token bucket of bytes, `2 x --max-module-size` at once, then
  `--max-module-size / 4` a second; a load costs its source's bytes plus LOAD_OVERHEAD (the
  parser's start). A load the bucket cannot pay yet waits until it can, on its session's
  thread (as the parse does) -- unless that is more than MAX_LOAD_WAIT_S: then it is
  refused, ACL_ERROR_RT_OVER_LIMIT (207012), and costs nothing.
* **a fair share** (`FairQueue`): the loads that may start wait in one queue per client,
  served in turn (round robin), one parse per client at a time; at most `parsers` (one per
  CPU) parse a large module at once, and one more slot takes only small modules
  (SMALL_MODULE bytes at most), so a small load waits for no large parse to end.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.rate_limits import TokenBucket
from simnpu.server.kernels.discovery import SMALL_MODULE  # (and parsed at a higher priority)

LOAD_OVERHEAD = 16 << 10
"""Bytes a load costs besides its source: the parser's start costs as much as parsing this."""
REMEMBERED = 1024
"""Clients whose last turn the queue remembers (a client it forgot is served as a newcomer)."""
MAX_LOAD_WAIT_S = 30.0
"""The longest a load waits for its client's rate; one that would wait longer is refused."""

T = TypeVar("T")


@dataclass(eq=False)
class Ticket:
    """One load waiting for, or holding, a parse slot."""

    client: str
    size: int  # bytes of source
    small: bool
    started: bool = False


class FairQueue:
    """Who parses next: one queue per client; of the clients with a load waiting and none
    parsing, the one served least recently goes first (a newcomer before all); at most
    `slots` parses of large modules at once, and `slots + 1` parses in all, so that a small
    module finds a slot while large ones hold all of theirs. Not thread-safe: ModuleLoads
    locks it."""

    def __init__(self, slots: int):
        self.slots = max(1, slots)
        self._waiting: dict[str, deque[Ticket]] = {}  # client -> its loads, in their order
        self._running: dict[str, Ticket] = {}
        self._large = 0  # parses of large modules running
        self._served: dict[str, int] = {}  # client -> when it was last served
        self._turns = 0

    def add(self, ticket: Ticket) -> None:
        """`ticket` waits behind its client's earlier ones."""
        self._waiting.setdefault(ticket.client, deque()).append(ticket)

    def start(self) -> list[Ticket]:
        """Start every ticket that may start now, in turn; the tickets started."""
        started: list[Ticket] = []
        while len(self._running) <= self.slots:
            ready = [
                client
                for client, queue in self._waiting.items()
                if client not in self._running and (queue[0].small or self._large < self.slots)
            ]
            if not ready:
                break
            client = min(ready, key=lambda c: self._served.get(c, -1))  # (ties: arrival)
            queue = self._waiting[client]
            ticket = queue.popleft()
            if not queue:
                del self._waiting[client]
            self._turns += 1
            self._served[client] = self._turns
            ticket.started = True
            self._running[client] = ticket
            self._large += not ticket.small
            started.append(ticket)
        return started

    def done(self, ticket: Ticket) -> None:
        """`ticket`'s parse ended."""
        if self._running.get(ticket.client) is ticket:
            del self._running[ticket.client]
            self._large -= not ticket.small
        if len(self._served) > REMEMBERED:  # the idle clients' turns are forgotten
            for client in [c for c in self._served if not self.busy(c)]:
                del self._served[client]

    def busy(self, client: str) -> bool:
        return client in self._running or client in self._waiting

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    @property
    def running(self) -> int:
        return len(self._running)


class ModuleLoads:
    """The daemon's module loads: each client's rate and the fair queue of parses (any
    thread). `clock` and `sleep` are time's, or fakes in tests."""

    def __init__(
        self,
        max_module_bytes: int,
        parsers: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.burst = 2 * max_module_bytes + 2 * LOAD_OVERHEAD  # two of the largest at once
        self.rate = max(max_module_bytes / 4, 64 << 10)  # one of the largest every 4 s
        self.max_wait_s = MAX_LOAD_WAIT_S
        self._clock = clock
        self._sleep = sleep
        self._cond = threading.Condition()
        self._queue = FairQueue(parsers or os.cpu_count() or 1)
        self._buckets: dict[str, TokenBucket] = {}
        self.loads = 0  # parses done
        self.waited = 0  # loads that waited for their client's rate
        self.refused = 0  # loads refused: they would have waited too long

    def load(self, client: str, size: int, parse: Callable[[], T]) -> T:
        """Run `parse()` (of a module of `size` bytes, for `client`) when the client's rate
        and turn allow. Blocks; NpuError 207012 if the rate would make it wait more than
        MAX_LOAD_WAIT_S."""
        cost = size + LOAD_OVERHEAD
        with self._cond:
            bucket = self._bucket(client)
            wait = bucket.reserve(cost)
            if wait > self.max_wait_s:
                bucket.give_back(cost)
                self.refused += 1
                raise NpuError(
                    codes.ACL_ERROR_RT_OVER_LIMIT,
                    f"this client ({client}) loads kernel modules faster than the daemon "
                    f"parses them for one client ({self.rate / 1024:,.0f} KiB of source a "
                    f"second, {LOAD_OVERHEAD >> 10} KiB more per module, "
                    f"{self.burst >> 10:,} KiB at once): this one would wait {wait:.0f} s, "
                    f"more than {self.max_wait_s:g} s; load it later",
                )
            if wait:
                self.waited += 1
        if wait:
            self._sleep(wait)
        ticket = Ticket(client, size, size <= SMALL_MODULE)
        with self._cond:
            self._queue.add(ticket)
            self._start()
            while not ticket.started:
                self._cond.wait()
        try:
            return parse()
        finally:
            with self._cond:
                self._queue.done(ticket)
                self.loads += 1
                self._start()

    def describe(self) -> dict:
        """For the Query RPC (simnpu smi --json): parses running and waiting, loads done,
        loads that waited for their client's rate, loads refused."""
        with self._cond:
            return {
                "parsing": self._queue.running,
                "waiting": self._queue.waiting,
                "loads": self.loads,
                "rate_waited": self.waited,
                "rate_refused": self.refused,
            }

    def _start(self) -> None:
        if self._queue.start():
            self._cond.notify_all()

    def _bucket(self, client: str) -> TokenBucket:
        """`client`'s bucket; buckets of other clients that are full and idle are forgotten
        (a new one would be the same)."""
        for other in [k for k, b in self._buckets.items() if k != client and b.full]:
            if not self._queue.busy(other):
                del self._buckets[other]
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = TokenBucket(self.rate, self.burst, self._clock)
        return bucket
