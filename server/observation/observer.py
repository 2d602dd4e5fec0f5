"""Observability in the daemon: the timeline and the checkers, and the hooks that feed them.

Off by default and free when off: the daemon has no Observer until `simnpu serve --trace /
--check` or a client's ObserveRequest asks for one; until then the scheduler has no
subscriber and every hook costs nothing (server/core/subscriber.py). The Observer is the
scheduler's subscriber: a client (its Owner) is observed (has a `Watch`) when the daemon
observes everyone or the client asked; its tasks carry a `Probe` (submit time, call site,
vector clock, the accesses a checked kernel reported). Unobserved clients' tasks have no
probe and cost one dict look-up at submit.

Hooks (server/core/subscriber.py; all under the scheduler lock unless said otherwise):

  Scheduler.queue         -> submitted(task)        probe, vector clock, checked kernels
  KernelTask hand-out     -> handed()               block range of a traced chunk
  Scheduler reports       -> ran(), accessed()      chunk times, kernel accesses
  Scheduler.complete      -> completing(task)       timeline record, checks, failures
  captures and replays    -> captured(), replaying(), joined(), replayed()
                             (server/observation/replays.py): captured sites, a model's tracks
  Session.handle_message  -> sites(), site()        the client's call sites (reader thread)
  handlers: sync/query/free/malloc, Session.close   host ordering, tombstones, leaks
  handlers: IPC import/close                        import call sites (unclosed imports)

The checks of a completed task and a session's leaks are server/observation/task_checks.py.
Findings become task failures (507053, at the next synchronize, as ACL reports memory
errors) when they are errors, and lines in the report; see docs/observability.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simnpu.proto import observe as flags_
from simnpu.proto.errors import NpuError
from simnpu.proto.observe import render
from simnpu.server.core.tasks import DeviceWork
from simnpu.server.observation import races, replays
from simnpu.server.observation.findings import Findings, log_finding, task_line
from simnpu.server.observation.memcheck import MemoryMap, Tombstone
from simnpu.server.observation.task_checks import MEMORY_ERROR, TaskChecks
from simnpu.server.observation.timeline import (
    DEFAULT_CAPACITY,
    Timeline,
    chrome_trace,
    write_json,
)
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.subscriber import Caller
    from simnpu.server.memory.device_memory import DeviceWithMemory
    from simnpu.server.memory.ipc_memory import IpcMemory

log = logging.getLogger("simnpu.observe")

TRACE, MEMCHECK, CHECKS = flags_.TRACE, flags_.MEMCHECK, flags_.CHECKS


class Probe:
    """What an observed task carries (Task.probe)."""

    __slots__ = (
        "accesses",
        "agent",
        "clock",
        "epoch",
        "fault",
        "ref",
        "site",
        "submit",
        "traced",
        "watch",
    )

    def __init__(self, submit: int, site: str, watch: Watch):
        self.submit, self.site, self.watch = submit, site, watch
        self.traced = bool(watch.flags & TRACE)
        self.agent = self.epoch = 0
        self.clock = None
        self.accesses: list = []
        self.fault = None
        self.ref = None


class Watch:
    """An observed client (`session`: its Owner)."""

    __slots__ = ("findings", "flags", "import_sites", "keys", "last_free_seq", "session", "sites")

    def __init__(self, session, flags: int):
        self.session, self.flags = session, flags
        self.sites: dict = {}  # seq -> call site, until the task or request takes it
        self.keys: dict = {}  # Stream -> its timeline key
        self.import_sites: dict = {}  # IPC key -> call site of its first open import
        self.findings = Findings()
        self.last_free_seq = -1


class Observer:
    """The timeline and the checkers of the daemon's `devices` (`ipc`: its IPC memory, whose
    unclosed imports are leaks): the scheduler's subscriber once the control plane has made
    it (server/control/daemon.py); `flags` are what every session gets."""

    def __init__(
        self,
        scheduler: Scheduler,
        devices: Sequence[DeviceWithMemory],
        ipc: IpcMemory,
        flags: int = 0,
        trace_path: str | None = None,
        report_path: str | None = None,
        capacity: int = DEFAULT_CAPACITY,
    ):
        self.scheduler = scheduler
        self.devices, self.ipc = devices, ipc
        self.flags = flags  # what every session gets
        self.trace_path, self.report_path = trace_path, report_path
        self.started_ns = time.monotonic_ns()
        self.timeline = Timeline(capacity)
        self.watches: dict = {}  # Owner -> Watch
        self.tracing = bool(flags & TRACE)  # someone is traced: workers' results are recorded
        self.blocks: dict = {}  # token -> (first, last) of a traced kernel chunk
        self.memory = MemoryMap()
        self.clocks = races.Clocks()
        self.findings = Findings()  # every session's, for the daemon's report
        self.checks = TaskChecks(self.memory, self.findings, self.watches, devices, ipc)

    # ---- sessions (reader threads) ---------------------------------------------------------------
    def hello(self, session: Owner) -> int:
        """Flags the client must honour (send call sites) because the daemon observes everyone."""
        if self.flags:
            self.watch(session, self.flags)
        return self.flags

    def watch(self, session: Owner, flags: int) -> Watch:
        with self.scheduler.lock:
            watch = self.watches.get(session)
            if watch is None:
                watch = self.watches[session] = Watch(session, flags | self.flags)
            else:
                watch.flags |= flags
            if watch.flags & TRACE:
                self.tracing = True
            return watch

    def sites(self, session: Owner, done: int, seqs: Sequence[int], names: Sequence[str]) -> None:
        """The call sites of an observed client's calls (its calls up to `done` have been
        handled: theirs go)."""
        watch = self.watches.get(session)
        if watch is None:
            return
        table = watch.sites
        if table:
            for seq in [s for s in table if s <= done]:
                del table[seq]
        table.update(zip(seqs, names))

    def site(self, session: Owner, seq: int, name: str) -> None:
        """The site of call `seq`, from a submission ring (ring thread); sites() prunes it."""
        watch = self.watches.get(session)
        if watch is not None:
            watch.sites[seq] = name

    # ---- the command path (scheduler lock) ------------------------------------------------------
    def submitted(self, task) -> None:
        owner = task.stream.owner
        watch = self.watches.get(owner)
        if watch is None:
            return
        now = time.monotonic_ns()
        checked = watch.flags & CHECKS
        if checked:
            site = watch.sites.pop(task.seq, None) or replays.site_of(task)
            probe = task.probe = Probe(now, site, watch)
            traced, site = probe.traced, probe.site
        else:  # traced only: a probe that says so: False on device work (its results are all
            # the timeline needs), (submit time, watch) on control tasks (recorded at the end)
            task.probe = False if isinstance(task, DeviceWork) else (now, watch)
            traced, site = True, None
        if (
            traced
        ):  # the timeline's "s" record (server/observation/timeline.py), written here: every task
            stream = task.stream
            key = watch.keys.get(stream)
            if key is None:
                key = watch.keys[stream] = self.timeline.stream_key(stream)
            name, n = task.timeline_entry()
            self.timeline.records.append(
                ("s", id(task), key, task.seq, task.kind, name, n, now, site)
            )
        if checked:
            self.clocks.stamp(task, probe, owner, task.blocks_host)
            task.record_accesses()

    def handed(self, token: int, first: int, last: int) -> None:
        """A chunk of a launch went out: the timeline names a traced one's blocks."""
        if self.tracing:
            self.blocks[token] = (first, last)

    def ran(self, unit, results) -> None:
        """A unit's results, before the scheduler takes them: one timeline record for those
        of traced tasks (an HCCL collective's data movement has no probe)."""
        if not self.tracing:
            return
        inflight, blocks = unit.inflight, self.blocks
        runs = []
        for token, code, start, end, *_ in results:
            task = inflight[token]
            chunk = blocks.pop(token, None) if blocks else None
            probe = task.probe
            if probe is False or (probe is not None and probe.traced):
                runs.append((id(task), start, end, chunk, code))
        if runs:
            self.timeline.ran(unit, tuple(runs))

    def accessed(self, unit, report) -> None:
        """What a checked kernel touched (server/units/access_log.py)."""
        task = unit.inflight.get(report.token)
        probe = getattr(task, "probe", None)
        if probe.__class__ is Probe:
            probe.accesses.extend(report.entries)
            if report.fault is not None and probe.fault is None:
                probe.fault = report.fault

    def completing(self, task) -> None:
        probe = task.probe
        if probe.__class__ is tuple:  # a traced-only control task
            self._done(task)
            return
        watch = probe.watch
        if probe.traced and (not isinstance(task, DeviceWork) or task.failure is not None):
            self._done(task)
        if watch.flags & CHECKS:
            try:
                self.checks.check(task, probe, watch)
            except Exception:  # a checker bug must not stop the device
                log.exception("checking task %d of %r failed", task.seq, watch.session)

    def _done(self, task) -> None:
        end = task.timestamp if task.timed and task.timestamp else time.monotonic_ns()
        self.timeline.done(task, end)

    # ---- graphs (scheduler lock; server/observation/replays.py) --------------------------------
    def captured(self, task) -> None:
        replays.captured(self, task)

    def replaying(self, stream, model: int, lanes) -> None:
        replays.replaying(self, stream, model, lanes)

    def joined(self, into, streams) -> None:
        replays.joined(self, into, streams)

    def replayed(self, into, streams) -> None:
        replays.replayed(self, into, streams)

    # ---- host ordering (scheduler lock) ---------------------------------------------------------
    def host_synced(self, session, streams=(), record=None) -> None:
        """The host of `session` waits for (or saw complete) these streams / this record."""
        watch = self.watches.get(session)
        if watch is None or not watch.flags & CHECKS:
            return
        if streams:
            self.clocks.host_syncs_streams(session, streams)
        if record is not None and record.probe.__class__ is Probe:
            self.clocks.host_joins(session, record.probe.clock)

    # ---- memory (session reader threads) --------------------------------------------------------
    def allocated(self, owner, seq: int, device: int, address: int, size: int) -> None:
        """aclrtMalloc (call `seq`) of `owner` gave `address`."""
        watch = self.watches.get(owner)
        if watch is None or not watch.flags & CHECKS:
            return
        with self.scheduler.lock:
            self.memory.allocated(device, address, size, owner, watch.sites.pop(seq, "?"), seq)

    def imported(self, owner, seq: int, key: str) -> None:
        """aclrtIpcMemImportByKey (call `seq`) of `owner` opened `key`."""
        watch = self.watches.get(owner)
        if watch is None or not watch.flags & CHECKS:
            return
        with self.scheduler.lock:
            site = watch.sites.pop(seq, "?")
            watch.import_sites.setdefault(key, site)

    def import_closed(self, owner, key: str) -> None:
        """`owner` closed its last import of `key`."""
        watch = self.watches.get(owner)
        if watch is not None:
            with self.scheduler.lock:
                watch.import_sites.pop(key, None)

    def freeing(self, client: Caller, address: int) -> None:
        """aclrtFree of a live block of `client` (before it goes back to the allocator, or
        is kept for IPC importers: either way its owner has freed it, and may not use it)."""
        session = client.owner
        watch = self.watches.get(session)
        if watch is None or not watch.flags & CHECKS:
            return
        client.flush()  # what this message queued before the free is submitted first
        seq = client.seq
        with self.scheduler.lock:
            device, _ = split_device_address(address)
            site = watch.sites.pop(seq, "?")
            block = self.memory.freed(device, address)
            if block is None:
                return
            clock = self.clocks.host_clock(session)
            self.memory.tombstones.append(Tombstone(block, site, seq, clock))
            watch.last_free_seq = seq
            if not watch.flags & MEMCHECK:
                return
            for old in block.history:
                if old.session is session and not races.ordered_before(old.agent, old.epoch, clock):
                    lo, hi = old.lo, old.hi
                    text = (
                        f"{block.describe()} was freed at {site} (task {seq}) while "
                        f"{'a write' if old.write else 'a read'} of bytes [{lo:#x}, {hi:#x}) by\n"
                        f"  {task_line(old.ref, old.blocks)}\n"
                        "was not known to be finished: synchronize its stream "
                        "(or an event recorded after it) before aclrtFree "
                        "(aclrtFree does not wait for the device)"
                    )
                    _finding, new = self.checks.report(
                        watch,
                        "memcheck",
                        "use-after-free",
                        "error",
                        ("freed in use", site, old.ref["site"]),
                        text,
                        {"tasks": [old.ref], "range": [lo, hi], "free_site": site},
                    )
                    if new:
                        client.reject(
                            NpuError(MEMORY_ERROR, f"simnpu memcheck: use-after-free\n{text}")
                        )
                    break

    def session_closed(self, session: Owner) -> None:
        """The session ended (its queued work is done): leaks, then forget it."""
        with self.scheduler.lock:
            watch = self.watches.pop(session, None)
            if watch is None:
                return
            if watch.flags & MEMCHECK:
                for finding in self.checks.leaks(watch):
                    details = finding.details  # an import: its key tells it from another
                    key = (finding.kind, session.id, details["address"], details.get("key"))
                    self.findings.add(key, lambda f=finding: f)
                    log_finding(finding)
            if watch.flags & TRACE and not self.flags & TRACE:
                self.timeline.forget_session(session.id)
            self.memory.forget_session(session)
            self.clocks.forget_session(session)
            self.tracing = bool(self.flags & TRACE) or any(
                w.flags & TRACE for w in self.watches.values()
            )

    # ---- requests --------------------------------------------------------------------------------
    def trace_json(self, session=None) -> dict:
        with self.scheduler.lock:
            records = list(self.timeline.records)
        full = len(records) == self.timeline.capacity
        title = (
            "simnpu daemon"
            if session is None
            else f"simnpu client {session.pid} {session.process_name}"
        )
        return chrome_trace(
            self.timeline,
            records,
            self.started_ns,
            title,
            dropped=full,
            session_id=None if session is None else session.id,
        )

    def report_json(self, session=None, final: bool = False) -> dict:
        with self.scheduler.lock:
            if session is None:
                return self.findings.as_json(flags_.describe(self.flags & ~TRACE))
            watch = self.watches.get(session)
            if watch is None:
                return Findings().as_json("off")
            extra = self.checks.leaks(watch) if final and watch.flags & MEMCHECK else []
            return watch.findings.as_json(flags_.describe(watch.flags & ~TRACE), extra)

    def describe(self) -> dict:
        counts = self.findings.counts()
        return {
            "flags": flags_.describe(self.flags),
            "observed_sessions": len(self.watches),
            "trace_records": len(self.timeline),
            **counts,
        }

    def stop(self) -> None:
        """The daemon stops: write its trace and report files."""
        if self.trace_path and self.flags & TRACE:
            try:
                write_json(self.trace_path, self.trace_json())
                log.info("trace of %d records written to %s", len(self.timeline), self.trace_path)
            except OSError as error:
                log.error("cannot write the trace to %s: %s", self.trace_path, error)
        if self.report_path and self.flags & CHECKS:
            try:
                with open(self.report_path, "w", encoding="utf-8") as handle:
                    handle.write(
                        render(self.report_json(), f"simnpu daemon (pid {self.daemon_pid()})")
                    )
            except OSError as error:
                log.error("cannot write the check report to %s: %s", self.report_path, error)

    @staticmethod
    def daemon_pid() -> int:
        import os

        return os.getpid()


def write_files(observer: Observer | None) -> None:
    """The daemon stops: its observer, if it has one, writes its trace and report files."""
    if observer is not None:
        observer.stop()


def summary(observer: Observer | None) -> dict | None:
    """What the daemon observes, for its description (simnpu smi); None: nothing."""
    return observer.describe() if observer is not None else None


def hello_flags(observer: Observer | None, owner: Owner) -> int:
    """The observe flags a new session (of `owner`) must honour: the daemon's observer
    observes everyone."""
    return observer.hello(owner) if observer is not None else 0


def query(observer: Observer | None, what: str) -> object:
    """The Query RPC's "trace" and "check_report" views."""
    if observer is None:
        return {
            "error": "this daemon records no timeline and checks nothing (start it with "
            "`simnpu serve --trace FILE` or `--check all`, or set SIMNPU_TRACE / "
            "SIMNPU_CHECK in a client)"
        }
    if what == "trace":
        return observer.trace_json()
    report = observer.report_json()
    report["text"] = render(report, f"simnpu daemon (pid {observer.daemon_pid()})")
    return report
