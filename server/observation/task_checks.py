"""What checking finds in a completed task of a checked client -- memcheck (out of bounds,
use after free), initcheck (reads of bytes never written) and racecheck (accesses no
synchronization orders) -- and the leaks of a session at its end (docs/observability.md).

The observer (server/observation/observer.py) calls `check` when a task completes and
`leaks` when a session ends or asks for its final report; findings are reported once per
key (`report`), in the client's and the daemon's findings, and errors fail their task with
507053 as ACL reports memory errors. Under the scheduler lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import observe as flags_
from simnpu.server.core.streams import Failure
from simnpu.server.observation import races
from simnpu.server.observation.findings import Finding, Findings, log_finding, task_line
from simnpu.server.observation.memcheck import MemoryMap, add_range, classify_fault, missing
from simnpu.server.observation.timeline import stream_label

if TYPE_CHECKING:
    from simnpu.server.memory.device_memory import DeviceWithMemory
    from simnpu.server.memory.ipc_memory import IpcMemory

MEMCHECK, INITCHECK, RACECHECK, STRICT = (
    flags_.MEMCHECK,
    flags_.INITCHECK,
    flags_.RACECHECK,
    flags_.STRICT,
)
MEMORY_ERROR = codes.ACL_ERROR_RT_DEVICE_MEM_ERROR  # what checker errors fail tasks with


class TaskChecks:
    """The checks of the observer's clients: their allocations (`memory`), the daemon's
    findings (`findings`), the observed clients (`watches`: Owner -> Watch), and the
    daemon's `devices` and `ipc` memory (faults are classified by device; unclosed IPC
    imports are leaks)."""

    def __init__(
        self,
        memory: MemoryMap,
        findings: Findings,
        watches: dict,
        devices: Sequence[DeviceWithMemory],
        ipc: IpcMemory,
    ):
        self.memory, self.findings, self.watches = memory, findings, watches
        self.devices, self.ipc = devices, ipc

    def check(self, task, probe, watch) -> None:
        """`task` of the client `watch` observes completed: its fault and its accesses."""
        session = watch.session
        if probe.fault is not None and watch.flags & MEMCHECK and task.failure is not None:
            kind, why = classify_fault(
                self.memory,
                session,
                getattr(task, "bounds", ()) or (),
                probe.fault,
                self.devices,
            )
            ref = self._ref(task, probe)
            text = f"{why}\n  in {task_line(ref, (probe.fault[3], probe.fault[3]))}"
            self.report(
                watch,
                "memcheck",
                kind,
                "error",
                (kind, probe.site),
                text,
                {"tasks": [ref], "address": probe.fault[0], "bytes": probe.fault[1]},
            )
            task.failure.message = f"simnpu memcheck: {kind}: {why}\n{task.failure.message}"
        raced: set = set()  # tasks this one was found racing with (one finding per pair)
        for access in task.accesses():
            self._check_access(task, probe, watch, raced, *access)

    def _check_access(self, task, probe, watch, raced, space, key, lo, hi, mode, blocks) -> None:
        if hi <= lo:
            return
        session, flags = watch.session, watch.flags
        write = mode == 1
        if space == "seg":
            if not flags & RACECHECK:
                return
            segment = self.memory.segment(key, 1 << 62)
            self._race(task, probe, watch, raced, segment, lo, hi, write, blocks)
            return
        if task.seq < watch.last_free_seq:
            tomb = self.memory.tombstone_of(session, key, lo, hi, task.seq)
            if tomb is not None:
                if flags & MEMCHECK and not races.ordered_before(
                    probe.agent, probe.epoch, tomb.free_clock
                ):
                    a, b = max(lo, tomb.start), min(hi, tomb.start + tomb.size)
                    ref = self._ref(task, probe)
                    text = (
                        f"{'write' if write else 'read'} of bytes [{a:#x}, {b:#x}) of "
                        f"{tomb.describe()}\n"
                        f"  by {task_line(ref, blocks)}\n"
                        f"  the free (task {tomb.free_seq}) came after this task was submitted but "
                        "did not wait for it: synchronize before aclrtFree"
                    )
                    self.report(
                        watch,
                        "memcheck",
                        "use-after-free",
                        "error",
                        ("use-after-free", probe.site, tomb.free_site),
                        text,
                        {"tasks": [ref], "range": [a, b], "free_site": tomb.free_site},
                        task,
                    )
                return
        at = lo
        while at < hi:
            block = self.memory.find(key, at)
            if block is None:
                return  # not memory a checked session allocated
            top = min(hi, block.end)
            if flags & INITCHECK and mode == 0:
                gaps = missing(block.written, at, top)
                if gaps:
                    self._uninitialised(task, probe, watch, block, gaps, blocks)
            if mode:  # written, or given to a kernel as "rw": initialised from now on (an
                # "rw" store of the value already there is a write too)
                add_range(block.written, at, top)
            self._race(task, probe, watch, raced, block, at, top, write, blocks)
            at = top

    def _uninitialised(self, task, probe, watch, block, gaps, blocks) -> None:
        ref = self._ref(task, probe)
        count = sum(b - a for a, b in gaps)
        first = gaps[0]
        ranges = ", ".join(f"[{a:#x}, {b:#x})" for a, b in gaps[:3]) + (
            " ..." if len(gaps) > 3 else ""
        )
        text = (
            f"read of {count} byte(s) never written since the malloc: {ranges}, offset "
            f"{first[0] - block.start} of {block.describe()}\n"
            f"  by {task_line(ref, blocks)}"
        )
        self.report(
            watch,
            "initcheck",
            "uninitialised read",
            "error",
            ("init", probe.site, block.site),
            text,
            {"tasks": [ref], "range": [first[0], gaps[-1][1]], "bytes": count},
            task,
        )

    def _race(self, task, probe, watch, raced, block, lo, hi, write, blocks) -> None:
        flags = watch.flags
        if flags & RACECHECK and block.history:
            for old in races.check(block.history, lo, hi, write, probe):
                if id(old.ref) not in raced:
                    raced.add(id(old.ref))
                    self._report_race(task, probe, watch, block, old, lo, hi, write, blocks)
        ref = self._ref(task, probe)
        races.remember(
            block.history,
            races.Access(lo, hi, write, probe.agent, probe.epoch, ref, blocks, watch.session),
            probe.clock,
        )

    def _report_race(self, task, probe, watch, block, old, lo, hi, write, blocks) -> None:
        a, b = max(lo, old.lo), min(hi, old.hi)
        ref = self._ref(task, probe)
        pair = f"{'write' if old.write else 'read'}-{'write' if write else 'read'}"
        where = block.describe() if block.space == "dev" else "pinned host memory (offsets)"
        across = old.session is not watch.session
        text = (
            f"data race ({pair}) on {b - a} byte(s) [{a:#x}, {b:#x}) of {where}\n"
            f"  {'write' if old.write else 'read '} by {task_line(old.ref, old.blocks)}\n"
            f"  {'write' if write else 'read '} by {task_line(ref, blocks)}\n"
            + (
                "  the two tasks belong to different clients, and neither client's host "
                "synchronized with its task before the other was submitted"
                if across
                else "  nothing orders them: record an event after the first task and make the "
                "second's stream wait for it (aclrtRecordEvent + aclrtStreamWaitEvent), or "
                "synchronize in between"
            )
        )
        strict = bool(watch.flags & STRICT)
        key = ("race", old.ref["site"], old.ref["what"], probe.site, ref["what"])
        finding, new = self.report(
            watch,
            "racecheck",
            "data race",
            "error" if strict else "warning",
            key,
            text,
            {"tasks": [old.ref, ref], "range": [a, b], "bytes": b - a, "cross_client": across},
            task if strict else None,
        )
        other = self.watches.get(old.session) if across else None
        if new and other is not None:  # the other client's report shows it too
            other.findings.add(key, lambda: finding)

    def leaks(self, watch) -> list:
        """What the session still holds: its allocations never freed, its IPC imports never
        closed (an exporter's block freed while imported is the importers', not a leak)."""
        out = []
        for block in self.memory.live_of(watch.session):
            text = (
                f"{block.size} bytes at {block.start:#x} allocated at {block.site} (call "
                f"{block.seq}) were never freed"
            )
            out.append(
                Finding(
                    "memcheck",
                    "leak",
                    "warning",
                    text,
                    {"address": block.start, "bytes": block.size, "malloc_site": block.site},
                    watch.session,
                )
            )
        for export, opened, held in self.ipc.imports_of(watch.session):
            site = watch.import_sites.get(export.key, "?")
            times = f" ({opened} imports)" if opened > 1 else ""
            text = (
                f"{watch.session!r} never closed its IPC import of {export.key}{times}: "
                f"{export.size} bytes at {export.address:#x}, exported by {export.exporter!r}, "
                f"imported at {site}; every aclrtIpcMemImportByKey needs an aclrtIpcMemClose"
                + (
                    " (the exporter has freed the block: it stays allocated until then)"
                    if held
                    else ""
                )
            )
            out.append(
                Finding(
                    "memcheck",
                    "unclosed IPC import",
                    "warning",
                    text,
                    {"address": export.address, "bytes": export.size, "key": export.key},
                    watch.session,
                )
            )
        return out

    def report(self, watch, check, kind, severity, key, text, details, task=None) -> tuple:
        """(the finding, whether it is new) of `key` for the client `watch` observes; an
        error fails `task`, if given."""
        session = watch.session
        finding, new = watch.findings.add(
            key, lambda: Finding(check, kind, severity, text, details, session)
        )
        if new:
            self.findings.add((session.id,) + key, lambda: finding)
            log_finding(finding)
        if severity == "error" and task is not None and task.failure is None:
            task.failure = Failure(MEMORY_ERROR, f"simnpu {check}: {kind}\n{text}", task.seq)
        return finding, new

    def _ref(self, task, probe) -> dict:
        ref = probe.ref
        if ref is None:
            session = task.stream.owner
            ref = probe.ref = {
                "task": task.seq,
                "what": _what(task),
                "stream": stream_label(task.stream),
                "pid": session.pid,
                "process": session.process_name,
                "site": probe.site,
                "client": session.id,
            }
        return ref


def _what(task) -> str:
    name, category, _ = task.describe()
    return f"kernel {name}" if category == "kernel" else name
