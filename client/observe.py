"""Tracing and checking from the client: SIMNPU_TRACE, SIMNPU_CHECK, and the same as an API.

    SIMNPU_CHECK=memcheck,initcheck,racecheck   (or all; add strict to fail tasks on races)
    SIMNPU_CHECK_REPORT=report.txt              (%p = pid; see below)
    SIMNPU_TRACE=trace.json                     (Chrome/Perfetto trace of this process's tasks)

With either set, the runtime asks the daemon to observe its session at connect time
(OP_OBSERVE) and sends the call site of every call with it; when the session ends
(acl.finalize, simnpu.client.shutdown, or interpreter exit) it fetches its timeline and
its findings, writes the trace, and prints one line on stderr with the number of errors
and warnings found. The check report goes to SIMNPU_CHECK_REPORT whenever that is set;
without it, to simnpu-check-%p.txt only when something was found. Errors also surface as
ACL codes at synchronize (507053); warnings (races, leaks) only in the report. From code:

    from simnpu.client import observe
    observe.enable("memcheck,racecheck")     # or observe.enable(trace=True)
    ...
    observe.save_trace("run.json")           # the timeline so far
    print(observe.report()["findings"])      # the findings so far

See docs/observability.md.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto import observe as bits_
from simnpu.proto.errors import NpuError
from simnpu.proto.observe import render

if TYPE_CHECKING:
    from simnpu.client.transport import Connection

DEFAULT_REPORT = "simnpu-check-%p.txt"


def _path(template: str) -> str:
    return template.replace("%p", str(os.getpid()))


class ClientObserver:
    """The observing side of one session (a Runtime's `observer`). Its `flags` are the
    observation in force: while any is, the streams' signals decide no synchronize
    (client/runtime/synchronization.py reads them at each call)."""

    def __init__(self, connection: Connection, daemon_flags: int):
        self.connection = connection
        self.flags = daemon_flags  # in force for this session
        self.asked = 0  # what this process asked for (its files are written for these)
        self._finished = False
        self._lock = threading.Lock()
        try:
            checks = bits_.parse_checks(os.environ.get("SIMNPU_CHECK"))
        except ValueError as error:
            connection.close()
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"SIMNPU_CHECK: {error}") from None
        self.trace_path = os.environ.get("SIMNPU_TRACE") or None
        self.report_path = os.environ.get("SIMNPU_CHECK_REPORT") or None  # named: always written
        self.summarize = bool(checks)  # SIMNPU_CHECK: the line; DEFAULT_REPORT if anything found
        wanted = checks | (bits_.TRACE if self.trace_path else 0)
        if wanted:
            self.enable(wanted)
            atexit.register(self.finish)
        elif daemon_flags & bits_.SITES:
            connection.start_sending_sites()

    def enable(self, flags: int) -> int:
        """Ask the daemon to observe this session (more flags add to those in force). Blocks."""
        reply = self.connection.call(pb.ObserveRequest(flags=flags))
        self.asked |= flags
        self.flags = reply.flags
        self.connection.start_sending_sites()
        return self.flags

    def trace(self) -> dict:
        """This session's timeline as a Chrome trace (after its queued work has run). Blocks."""
        connection = self.connection
        trace = json.loads(connection.call(pb.ObserveTraceRequest()).json)
        for event in trace.get("traceEvents", ()):  # traced-only sessions send no sites: add ours
            args = event.get("args")
            if args and "task" in args and "site" not in args and event.get("cat") != "core":
                site = connection.site_of(args["task"])
                if site:
                    args["site"] = site
        return trace

    def report(self, final: bool = False) -> dict:
        """This session's findings so far; `final` also lists its live allocations as leaks.
        Blocks."""
        return json.loads(self.connection.call(pb.ObserveReportRequest(final=final)).json)

    def finish(self) -> None:
        """Write the files this process asked for (once): the trace; the check report (to
        the path named, else to DEFAULT_REPORT if anything was found) and its line."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        if not self.asked or self.connection.broken is not None:
            return
        try:
            if self.trace_path and self.asked & bits_.TRACE:
                path = _path(self.trace_path)
                write_json(path, self.trace())
            if (self.report_path or self.summarize) and self.asked & bits_.CHECKS:
                report = self.report(final=True)
                path = _path(self.report_path or DEFAULT_REPORT)
                written = bool(self.report_path or report["findings"])
                if written:
                    title = (
                        f"client {os.getpid()} "
                        f"({os.path.basename(sys.argv[0] or 'python') or 'python'})"
                    )
                    with open(path, "w", encoding="utf-8") as handle:
                        handle.write(render(report, title))
                print(
                    f"simnpu check: {report['errors']} error(s), {report['warnings']} warning(s)"
                    + (f"; report in {path}" if written else ""),
                    file=sys.stderr,
                )
        except (NpuError, OSError) as error:
            print(f"simnpu: could not write the trace/check report: {error}", file=sys.stderr)


def write_json(path: str, document: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(document, handle, separators=(",", ":"))
    os.replace(temporary, path)


# ---- the Pythonic API ---------------------------------------------------------------------------
def _observer() -> ClientObserver:
    from simnpu.client.device import runtime

    return runtime().observer


def enable(
    checks: str = "",
    trace: bool = False,
    report_path: str | None = None,
    trace_path: str | None = None,
) -> str:
    """Turn checking (e.g. "memcheck,racecheck", "all") and/or tracing on for this process's
    session from now on; returns what is in force. Files are written when the session ends
    only if paths are given here (or by SIMNPU_TRACE / SIMNPU_CHECK_REPORT; the check report
    also when SIMNPU_CHECK is set and something was found). Blocks."""
    observer = _observer()
    try:
        bits = bits_.parse_checks(checks) | (bits_.TRACE if trace or trace_path else 0)
    except ValueError as error:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, str(error)) from None
    if trace_path:
        observer.trace_path = trace_path
    if report_path:
        observer.report_path = report_path
    if not observer.asked:
        atexit.register(observer.finish)
    return bits_.describe(observer.enable(bits))


def trace() -> dict:
    """This process's timeline so far, as a Chrome/Perfetto trace document. Blocks."""
    return _observer().trace()


def save_trace(path: str) -> None:
    """Write this process's timeline so far to `path` (open it in ui.perfetto.dev). Blocks."""
    write_json(_path(path), trace())


def report(final: bool = False) -> dict:
    """This process's checker findings so far ({"errors", "warnings", "findings": [...]}).
    Blocks."""
    return _observer().report(final)


def report_text(final: bool = False) -> str:
    """The same, as the report file's text."""
    return render(report(final), f"client {os.getpid()}")
