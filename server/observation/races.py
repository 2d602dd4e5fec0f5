"""Cross-stream race detection: happens-before by vector clocks, checked over byte ranges.

Every stream of a checked session is an agent with its own clock; so is each client's
host. A task's vector clock is fixed when it is submitted (in submission order, under the
scheduler lock), so what is ordered does not depend on how the run was timed:

- a task comes after every earlier task of its stream (streams are FIFO);
- a task comes after everything its client's host had synchronised with when it was
  submitted (synchronize stream/device/event, a stream or event query that answered
  "complete", a synchronous copy or memset, a pageable copy, destroying a stream or a
  context -- they return only once done);
- a stream wait comes after the event record it binds to (the latest record at the time
  of the wait), so everything after the wait on its stream comes after everything before
  the record on the recording stream;
- between clients, whatever a client's host has synchronised with is treated as ordered
  before everything any client submits afterwards: clients can only coordinate through
  the host (pipes, files, sockets the daemon cannot see), and a correct program lets its
  peer go on only after synchronising. Unsynchronised work of two clients is unordered.
  (So between clients, and only there, what is found depends on when each client's
  work reached the daemon relative to the other's synchronisation.)

Not ordering: host submission order across streams, stream priorities, HCCL collectives
(their send/recv buffers are not checked), host callbacks (they run on another thread).

Accesses (byte ranges read or written) are checked when a task completes: copies and
memsets from their arguments, kernels from the views they actually used (server/
access_log.py). Two accesses race when their ranges overlap, at least one writes, they
come from different agents and neither task happens before the other. Since a task can
only complete after everything that happens before it, the later-completing of two
accesses always finds the earlier one still in the shadow history, whichever order the
run happened to take: a race is reported on every run, not only when it bit.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.streams import Stream

HISTORY_CAP = 256  # accesses remembered per allocation (oldest dropped first)


def join(into: dict, other: dict) -> None:
    for agent, epoch in other.items():
        if into.get(agent, 0) < epoch:
            into[agent] = epoch


class Clocks:
    """The vector clocks of streams and hosts (scheduler lock held)."""

    def __init__(self):
        self._agents = itertools.count(1)
        self.streams: dict[Stream, list] = {}  # Stream -> [agent, clock of its latest task]
        self.hosts: dict = {}  # Session -> clock of what its host has synchronised with
        self.world: dict = {}  # what any host has synchronised with (ordering across clients)

    def stamp(self, task, probe, session, blocks_host: bool) -> None:
        """Give a newly submitted task its agent, epoch and vector clock."""
        stream = task.stream
        entry = self.streams.get(stream)
        if entry is None:
            entry = self.streams[stream] = [next(self._agents), {}]
        agent = entry[0]
        clock = dict(entry[1])
        join(clock, self.world)
        host = self.hosts.get(session)
        if host:
            join(clock, host)
        record = task.follows()  # a wait joins its record's clock
        if record is not None:
            record_clock = getattr(record.probe, "clock", None)  # None: not checked then
            if record_clock is not None:
                join(clock, record_clock)
        epoch = clock.get(agent, 0) + 1
        clock[agent] = epoch
        entry[1] = clock
        probe.agent, probe.epoch, probe.clock = agent, epoch, clock
        if blocks_host:  # the host waits for it: everything before it is now known done
            self.host_joins(session, clock)

    def host_joins(self, session, clock: dict | None) -> None:
        if not clock:
            return
        host = self.hosts.get(session)
        if host is None:
            host = self.hosts[session] = {}
        join(host, clock)
        join(self.world, clock)

    def host_syncs_streams(self, session, streams) -> None:
        for stream in streams:
            entry = self.streams.get(stream)
            if entry is not None:
                self.host_joins(session, entry[1])

    def host_clock(self, session) -> dict:
        clock = dict(self.world)
        join(clock, self.hosts.get(session, {}))
        return clock

    def forget_session(self, session: Owner) -> set:
        """Drop a finished session's clocks; returns its agents (its work is all done: the caller
        forgets their accesses too, so nothing later is compared with them)."""
        self.hosts.pop(session, None)
        agents = set()
        for stream in [s for s in self.streams if s.context.owner is session]:
            agents.add(self.streams.pop(stream)[0])
        for agent in agents:
            self.world.pop(agent, None)
        for entry in self.streams.values():  # (a tail clock is also its task's: replace, not edit)
            if any(agent in entry[1] for agent in agents):
                entry[1] = {a: e for a, e in entry[1].items() if a not in agents}
        for session_of, host in list(self.hosts.items()):
            if any(agent in host for agent in agents):
                self.hosts[session_of] = {a: e for a, e in host.items() if a not in agents}
        return agents


def ordered_before(agent: int, epoch: int, clock: dict) -> bool:
    """Whether the access of (agent, epoch) happens before whatever has vector clock `clock`."""
    return clock.get(agent, 0) >= epoch


class Access:
    """One remembered access to an allocation: bytes [lo, hi), by a task."""

    __slots__ = ("agent", "blocks", "epoch", "hi", "lo", "ref", "session", "write")

    def __init__(self, lo, hi, write, agent, epoch, ref, blocks, session):
        self.lo, self.hi, self.write = lo, hi, write
        self.agent, self.epoch, self.ref, self.blocks, self.session = (
            agent,
            epoch,
            ref,
            blocks,
            session,
        )


def check(history: list, lo: int, hi: int, write: bool, probe) -> list:
    """The remembered accesses that race with a new access [lo, hi) of the task of `probe`."""
    clock, agent = probe.clock, probe.agent
    found = []
    for old in history:
        if old.hi <= lo or old.lo >= hi or not (write or old.write) or old.agent == agent:
            continue
        if clock.get(old.agent, 0) >= old.epoch:
            continue  # the old access happens before this one
        found.append(old)
    return found


def remember(history: list, access: Access, clock: dict) -> None:
    """Add `access`; drop what it makes redundant (covered by it, and ordered before it if it
    writes, or the same agent's same kind of access), then the oldest beyond HISTORY_CAP."""
    lo, hi = access.lo, access.hi
    kept = []
    for old in history:
        covered = lo <= old.lo and old.hi <= hi
        if covered and (
            (old.agent == access.agent and old.write == access.write)
            or (access.write and clock.get(old.agent, 0) >= old.epoch)
        ):
            continue
        kept.append(old)
    kept.append(access)
    if len(kept) > HISTORY_CAP:
        del kept[: len(kept) - HISTORY_CAP]
    history[:] = kept
