"""The daemon's Executor (server/core/executor.py): every unit a worker process
(server/units/worker_main.py), spawned and supervised here, its batches and reports on a
pipe; a client's own kernels go to its kernel processes (server/units/kernel_processes.py).

Workers start per device, when the daemon first needs the device (docs/device-memory.md); a
unit whose worker has not reported Ready is handed nothing. The scheduler thread sleeps in
`wait`, one poll() over every worker pipe and a wake-up pipe (rebuilt only when a worker is
replaced), so an idle daemon burns no CPU. Sessions' threads `send` under the scheduler
lock; only the scheduler thread reads the pipes.

A kernel process is untrusted: its socket is a `ReportChannel` (server/units/report_channel.py),
read and written without blocking, under the kernel processes' lock. What a send cannot
write now waits in the channel; the sender wakes the scheduler thread, which polls that
socket for POLLOUT too and flushes it when it is writable. A report half written waits in
the channel until it is whole -- or until the batch's operator timeout ends the process.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from simnpu.server.core.executor import LOST, BackingChanges, Unit, Windows
from simnpu.server.core.rate_limits import log_about
from simnpu.server.core.unit_protocol import (
    Cancel,
    ForgetSegment,
    LoadModule,
    MapBacking,
    MapWindows,
    RunKernel,
    RunKernels,
)
from simnpu.server.units.kernel_processes import KernelProcess, KernelProcesses
from simnpu.server.units.report_codec import BadReport, decode_report
from simnpu.server.units.spawning import (
    entry_point,
    keep_working_directory_off_import_path,
    stream_large_copies,
)

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner

log = logging.getLogger("simnpu.workers")

_SPAWN = multiprocessing.get_context("spawn")
_WORKER_MAIN = entry_point("simnpu.server.units.worker_main:main")
_GROUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # what a signal to the daemon's group sends
_READABLE = select.POLLIN
_WRITABLE = select.POLLIN | select.POLLOUT
EXIT_WAIT_S = 2.0  # a worker or kernel process whose pipe closed has this long to exit by itself


class WorkerProcess:
    """One worker process and its pipe."""

    def __init__(self, unit: Unit, segments: list[str]):
        parent, child = _SPAWN.Pipe()
        self.process: BaseProcess = _SPAWN.Process(
            target=_WORKER_MAIN,
            args=(unit.core_id, segments, child),
            name=f"simnpu-{unit.kind.value.replace(' ', '-')}-{unit.device}.{unit.index}",
            daemon=True,
        )
        # Born with the group's signals blocked, until its main ignores them: a worker still
        # booting (workers start while the daemon serves) must not die of a Ctrl-C either.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        child.close()
        self.conn: Connection = parent
        self.hung_up = False  # its pipe was found closed: it is exiting

    def end(self) -> str:
        """Reap the process -- a worker that hung up is waited for, one that did not (it is
        stuck) is killed at once -- and say how it ended: its own exit code or signal, or
        "stopped responding" if it had to be killed."""
        process = self.process
        process.join(EXIT_WAIT_S if self.hung_up else 0)
        if process.is_alive():
            process.kill()
            process.join(5)
            return "stopped responding"
        code = process.exitcode
        assert code is not None  # reaped: no longer alive
        if code >= 0:
            return f"exited with code {code}"
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:  # a number the signal module has no name for
            return f"was killed by signal {-code}"


class ProcessExecutor:
    """Worker processes for `units`, each mapping the device segments `segments` from the
    files `backing` names, and the windows of `windows`."""

    def __init__(
        self,
        units: Sequence[Unit],
        segments: list[str],
        windows: Windows,
        backing: BackingChanges,
    ):
        self.units = units
        self._segments = segments
        self._windows = windows
        self._backing = backing
        self._processes: dict[Unit, WorkerProcess] = {}
        self._lock = threading.Lock()  # guards adding workers (launch) against stop
        self._stopped = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller: select.poll | None = None  # rebuilt when a worker is replaced
        self._by_fd: dict[int, tuple[Unit, KernelProcess | WorkerProcess]] = {}
        # pipes of replaced workers: the scheduler thread may be reading one, so it closes
        # them itself, when it next builds its poll set
        self._retired: list = []
        self.kernels = KernelProcesses(len(segments))  # where clients' own kernels run
        self._kernels_version = -1  # of the kernel processes the poller watches
        # units whose batch a kernel process runs (or the error of getting one)
        self._running: dict[Unit, KernelProcess | OSError] = {}
        # kernel processes whose channel has output waiting, for the scheduler thread to
        # poll for POLLOUT (under the kernel processes' lock)
        self._flushing: set[KernelProcess] = set()
        self._writing: set[int] = set()  # descriptors the poll set watches for POLLOUT
        # kernel processes whose socket closed, by when they must have exited by themselves
        # (time.monotonic()); the poll set watches their pidfds (the scheduler thread's)
        self._exiting: dict[KernelProcess, float] = {}

    def start(self, units: Sequence[Unit]) -> None:
        """Start the kernel zygote and wait until it is ready (blocks), then launch the
        workers of `units` (the others later: `launch`); they boot meanwhile, each unit ready
        once its worker reports Ready."""
        keep_working_directory_off_import_path()
        stream_large_copies()
        # multiprocessing starts its resource tracker at its first spawn, and then unblocks
        # SIGINT and SIGTERM in the spawning thread: the first worker would be born with the
        # group's signals deliverable (WorkerProcess blocks them). Started here, it is not.
        resource_tracker.ensure_running()
        self.kernels.start()
        self.launch(units)

    def launch(self, units: Sequence[Unit]) -> None:
        """Start the workers of `units` without waiting for them: each unit becomes ready
        when its worker's Ready report comes through `wait`, as a replaced worker's does.
        The caller may be any thread, a session's too (`end_with_daemon`)."""
        with self._lock:
            if self._stopped:
                return
            for unit in units:
                self._processes[unit] = WorkerProcess(unit, self._segments)
            self._poller = None  # the scheduler thread polls the new pipes from its next wait
        self.wake()

    def send(self, unit: Unit, batch: list, tenant: Owner | None = None) -> None:
        if tenant is not None:
            self._send_to_kernel_process(unit, batch, tenant)
            return
        process = self._processes.get(unit)
        if process is None:
            raise OSError("the daemon is stopping: its workers are gone")
        if (
            unit.forget
            or unit.windows != self._windows.version
            or unit.backing != self._backing.version
        ):
            batch = self._mappings(unit) + batch
        try:
            process.conn.send(batch)
        except ValueError as error:  # a closed pipe
            raise OSError(str(error)) from None
        except OSError:  # the worker closed its end: it is exiting
            process.hung_up = True
            raise

    def _mappings(self, unit: Unit) -> list:
        """What `unit` unmaps and maps before its next batch: the changes of backing since
        its last batch (blocks of another owner), the window table if it changed (an
        aclrtMapMem since), then the segments unlinked since."""
        items = [ForgetSegment.pack(name) for name in unit.forget]
        unit.forget = []
        windows = self._windows
        if unit.windows != windows.version:
            unit.windows = windows.version
            items.insert(0, MapWindows.pack(windows.entries))
        if unit.backing != self._backing.version:
            unit.backing, changes, _ = self._backing.since(unit.backing)
            items.insert(0, MapBacking.pack(changes))
        return items

    def _send_to_kernel_process(self, unit: Unit, batch: list, tenant: Owner) -> None:
        """A batch of `tenant`'s own kernels goes to its kernel process for `unit`
        (server/units/kernel_processes.py), with the modules that process has not loaded yet.
        Under the kernel processes' lock, as every use of a kernel process's socket is: a
        process ended meanwhile by another thread (a free) closes its socket, and a send
        racing that close could write into whatever descriptor reused its number."""
        with self.kernels.lock:
            try:
                process, _ = self.kernels.process_for(tenant, unit)
            except OSError as error:
                self._running[unit] = error
                raise
            items = []
            tokens = []
            for item in batch:
                tag = item[0]
                if tag == LoadModule.TAG:
                    if item[1] in process.loaded:
                        continue
                    process.loaded.add(item[1])
                elif tag == RunKernel.TAG or tag == RunKernels.TAG:
                    tokens.append(item[1])
                items.append(item)
            process.tokens = tokens
            process.sent_ns = time.monotonic_ns()
            process.busy = True
            self._running[unit] = process
            if self._kernels_version != self.kernels.version:
                self.wake()  # the scheduler thread polls the new process from its next wait
            self._to_kernel_process(process, items)

    def _to_kernel_process(self, process: KernelProcess, message: object) -> None:
        """Send `message` to `process` without blocking (caller holds the kernel processes'
        lock): what its socket does not take now waits in its channel, and the scheduler
        thread flushes it when the socket is writable. Raises OSError if it is gone."""
        if not process.conn.send(message):
            self._flushing.add(process)
            self.wake()  # the scheduler thread polls its socket for POLLOUT from its next wait

    def cancel(self, unit: Unit, tokens: list[int]) -> None:
        with self.kernels.lock:  # (a kernel process's socket: see _send_to_kernel_process)
            running = self._running.get(unit)
            try:
                if isinstance(running, KernelProcess):
                    self._to_kernel_process(running, Cancel(tokens))
                elif unit in self._processes:
                    self._processes[unit].conn.send(Cancel(tokens))
                # else stopped: the workers are gone with what they ran
            except (OSError, ValueError):  # it died: its results never come; it is replaced
                pass

    def wait(self, timeout_s: float) -> list[tuple[Unit, int, Any]]:
        if self._poller is None or self._kernels_version != self.kernels.version:
            self._rebuild_poller()
        assert self._poller is not None  # _rebuild_poller sets it
        if self._flushing:  # (a send that adds one wakes this thread: read without the lock)
            self._watch_output()
        if self._exiting:
            timeout_s = min(timeout_s, self._kill_late_exits())
        by_fd = self._by_fd
        reports: list[tuple[Unit, int, Any]] = []
        for fd, events in self._poller.poll(math.ceil(timeout_s * 1000)):
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
                continue
            unit, process = by_fd.get(fd, (None, None))
            if unit is None or process is None:
                continue
            if isinstance(process, KernelProcess):
                generation = unit.generation  # (a report read after a restart is dropped)
                if process.hung_up:  # its pidfd: it has exited (or was ended meanwhile)
                    reports.extend((unit, generation, r) for r in self._exited(unit, process))
                    continue
                for report in self._kernel_reports(unit, process, fd, events):
                    reports.append((unit, generation, report))
                continue
            generation = unit.generation
            if self._processes.get(unit) is not process:  # replaced since the poll set was made
                continue
            try:
                report = process.conn.recv()
            except (EOFError, OSError):
                process.hung_up = True
                reports.append((unit, generation, LOST))
                continue
            reports.append((unit, generation, report))
        return reports

    def _kernel_reports(
        self, unit: Unit, process: KernelProcess, fd: int, events: int
    ) -> list[Any]:
        """What `process` (polled on `fd`, which had `events`) reported, checked (it is
        untrusted): its reports in order, then LOST if it failed; nothing if it has nothing
        whole to report yet (a report begun waits in its channel) or no longer runs the
        unit's batch (what it says then is only checked). Writes what waits for it if its
        socket is writable. Never blocks: its channel reads and writes only what the socket
        holds or takes now."""
        failure: Exception | None = None
        frames: list[bytes] = []
        with self.kernels.lock:  # (its socket: see _send_to_kernel_process)
            running = self._running.get(unit) is process
            conn = process.conn
            if conn.closed:  # ended meanwhile (the poll set is rebuilt next time)
                return [LOST] if running else []
            try:
                if events & select.POLLOUT and conn.flush() and fd in self._writing:
                    self._writing.discard(fd)  # all written: it waits for reports only
                    assert self._poller is not None  # (wait polls it)
                    self._poller.modify(fd, _READABLE)
                if events & ~select.POLLOUT:
                    frames = conn.receive()
            except (EOFError, OSError, BadReport) as error:
                failure = error
        reports: list[Any] = []
        try:
            for data in frames:
                report = decode_report(data, process.tokens, process.sent_ns)
                if not running:
                    continue
                reports.append(report)
                if report.__class__ is list:  # its batch is done
                    running = False
                    with self.kernels.lock:
                        if self._running.get(unit) is process:
                            del self._running[unit]
                            self.kernels.batch_done(process)
                        if process.conn.closed:  # it ended with its batch
                            break
        except BadReport as error:
            failure = error
        if failure is None:
            return reports
        if not isinstance(failure, BadReport):  # its socket closed: it is exiting, or its
            self._watch_exit(process, fd)  # kernel closed it; told by its pidfd, not waited for
            return reports
        log_about(  # at the client's rate (server/core/rate_limits.py)
            process.owner,
            log,
            logging.WARNING,
            "%s: the kernel process of %r sent a bad report (%s); ending it",
            unit.name,
            process.owner,
            failure,
        )
        if running:
            return [*reports, LOST]
        self.kernels.lost(process)  # it failed idle: its next batch gets a new one
        return reports

    def _watch_exit(self, process: KernelProcess, fd: int) -> None:
        """`process` closed its socket (polled on `fd`): poll its pidfd instead, which
        tells when it has exited; one still running EXIT_WAIT_S later is killed
        (_kill_late_exits). Waiting here would hold every client's work meanwhile."""
        process.hung_up = True
        self._exiting[process] = time.monotonic() + EXIT_WAIT_S
        assert self._poller is not None  # (wait polls it)
        self._poller.unregister(fd)
        self._writing.discard(fd)
        unit_and_process = self._by_fd.pop(fd)
        self._by_fd[process.pidfd] = unit_and_process
        self._poller.register(process.pidfd, select.POLLIN)

    def _kill_late_exits(self) -> float:
        """Kill the processes that hung up EXIT_WAIT_S ago and still run; how long until
        the next of the others is due (seconds)."""
        now = time.monotonic()
        due = math.inf
        for process, deadline in list(self._exiting.items()):
            if deadline <= now:
                self._exiting[process] = math.inf
                if not process.gone(0):  # (exited just now: its own status tells)
                    process.ended_because = "closed its socket to the daemon while it still ran"
                    process.kill()  # (its pidfd tells when it is gone)
            else:
                due = min(due, deadline - now)
        return due

    def _exited(self, unit: Unit, process: KernelProcess) -> list[Any]:
        """`process`, which hung up, has exited (or was ended meanwhile): LOST if it ran
        the unit's batch; ended without a word if it was idle."""
        self._exiting.pop(process, None)
        with self.kernels.lock:
            if process.conn.closed:  # ended meanwhile by another thread: the poll set is
                return []  # rebuilt next time (a batch it ran was told LOST then)
            running = self._running.get(unit) is process
        if running:
            return [LOST]
        self.kernels.lost(process)  # its next batch gets a new one
        return []

    def _watch_output(self) -> None:
        """Poll for POLLOUT the sockets of kernel processes whose channel has output waiting
        (the scheduler thread, before it polls)."""
        assert self._poller is not None  # (wait built it)
        with self.kernels.lock:
            flushing, self._flushing = self._flushing, set()
            for process in flushing:
                conn = process.conn
                if conn.closed or not conn.pending:
                    continue
                fd = conn.fileno()
                if self._by_fd.get(fd, (None, None))[1] is process and fd not in self._writing:
                    self._poller.modify(fd, _WRITABLE)
                    self._writing.add(fd)
                # else not polled yet: the poll set is rebuilt first, and watches it then

    def _rebuild_poller(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        self._kernels_version = self.kernels.version
        by_fd: dict[int, tuple[Unit, KernelProcess | WorkerProcess]] = {}
        with self._lock:
            processes = list(self._processes.items())
            retired, self._retired = self._retired, []
        for conn in retired:
            conn.close()
        for unit, process in processes:
            try:
                fd = process.conn.fileno()
            except OSError:  # closed: stopped meanwhile
                continue
            by_fd[fd] = (unit, process)
        writing = set()
        with self.kernels.lock:  # (their sockets: see _send_to_kernel_process)
            for kernel_process in self.kernels.processes():
                conn = kernel_process.conn
                if conn.closed:  # ended meanwhile
                    continue
                if kernel_process.hung_up:  # waited for by its pidfd (_watch_exit)
                    by_fd[kernel_process.pidfd] = (kernel_process.unit, kernel_process)
                    continue
                by_fd[conn.fileno()] = (kernel_process.unit, kernel_process)
                if conn.pending:
                    writing.add(conn.fileno())
        for fd in by_fd:
            poller.register(fd, _WRITABLE if fd in writing else _READABLE)
        live = {process for _, process in by_fd.values()}
        self._exiting = {p: due for p, due in self._exiting.items() if p in live}
        self._by_fd = by_fd
        self._writing = writing
        self._poller = poller

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def restart(self, unit: Unit) -> str:
        if self._stopped:  # the daemon is stopping: nothing is replaced
            unit.generation += 1
            unit.reset()
            return "was stopped with the daemon"
        running = self._running.pop(unit, None)
        if running is not None:  # a kernel process ran the batch: end it, keep the worker
            unit.generation += 1
            unit.restarts += 1
            unit.inflight = {}
            unit.deadline = None
            unit.lent = None
            if isinstance(running, KernelProcess):
                how = self.kernels.lost(running)
                return f"(the kernel process of {running.owner!r}) {how}"
            return f"(no kernel process: {running})"
        old = self._processes[unit]
        how = old.end()
        new = WorkerProcess(unit, self._segments)
        with self._lock:
            self._processes[unit] = new
            self._retired.append(old.conn)
        # only now: a report the scheduler thread reads from the old pipe meanwhile carries
        # the old generation, and is dropped as a replaced unit's
        unit.generation += 1
        unit.restarts += 1
        unit.reset()
        self._poller = None  # the scheduler thread polls the new pipe from its next wait
        self.wake()
        return how

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self.kernels.stop()
        for process in self._processes.values():
            try:
                process.conn.send(None)
            except (OSError, ValueError):
                pass
        for process in self._processes.values():
            process.process.join(2.0)
            if process.process.is_alive():
                process.process.kill()
                process.process.join(2.0)
            process.conn.close()
        self._processes.clear()
        for conn in self._retired:
            conn.close()
        self._retired.clear()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
