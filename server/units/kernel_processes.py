"""Kernel processes: a client's own kernels run in processes of that client alone, which
map only that client's device memory (docs/kernel-isolation.md).

The daemon never forks (it is multi-threaded: gRPC lives in it). A trusted *zygote*,
spawned at start with numpy and the kernel runner imported and the device segments open,
forks kernel processes on request and reaps them. A kernel process maps exactly the pages
of its client's grant (its blocks, its IPC imports) into one window per device whose other
pages stay PROT_NONE, closes every descriptor but its pipe to the daemon, enters the
sandbox (server/units/sandbox.py), then runs batches like a worker (`WorkRunner`,
server/units/workers.py). What it sends back is untrusted: JSON, never pickle, checked by
`decode_report` before the scheduler sees it.

`KernelProcesses` is the daemon's side: one process per (client, AI core) that ran the
client's kernels; made again when the client's memory changed since it was made (the
grant's generation); ended -- and waited for -- before memory it maps is freed, so no page
reaches another client while a kernel process still maps it; ended when the client goes.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import multiprocessing
import os
import queue
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import posix_ipc

from simnpu.proto import codes
from simnpu.server.core.unit_protocol import DAEMON_GONE, MAX_OUTPUT, Accesses, Cancel, next_message
from simnpu.server.units import sandbox
from simnpu.server.units.float_overflow import watch_numpy
from simnpu.shm import window
from simnpu.shm.addresses import DEVICE_SPAN

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit

log = logging.getLogger("simnpu.kernels")

PAGE = mmap.PAGESIZE
KERNEL_MEMORY = 2 << 30
"""What a kernel process may map beyond its windows and what it had at start (RLIMIT_AS)."""
MAX_REPORT = 4 << 20
"""The longest report a kernel process may send; a longer one ends it."""
MAX_MESSAGE = 64 << 10
"""A result's message is cut to this many characters."""
START_TIMEOUT_S = 60.0
SCRATCH_PREFIX = "simnpu-kernels-"
"""The zygote's scratch root, in the temporary directory: this, the daemon's pid, "-", and a
random part; kernel process `pid` writes in `<root>/<pid>` only."""
END_WAIT_S = 5.0  # how long a killed kernel process may take to be gone
EXIT_WAIT_S = 2.0  # how long one that closed its socket has to exit by itself

Span = tuple[int, int, int]  # (device, offset, length): whole pages of a device's segment
Mapping = tuple[int, int, int, int, str]
"""(device, reserved offset, length, source offset, source): a physical block mapped at a
reserved device address (aclrtMapMem; source window.OWN, the device's segment), or
registered host memory (source: its segment's name), whole pages."""


@dataclass(frozen=True)
class Grant:
    """The device memory a client's kernel processes map: whole pages, sorted and merged,
    and its mappings of physical blocks at reserved addresses. `generation` changes whenever
    the client's memory does."""

    generation: int
    spans: tuple[Span, ...]
    mappings: tuple[Mapping, ...] = ()


def page_spans(ranges: Iterable[Span]) -> tuple[Span, ...]:
    """(device, offset, length) byte ranges as sorted, merged, page-aligned spans."""
    spans: list[list[int]] = []
    for device, offset, length in sorted(
        (d, o & -PAGE, ((o + n + PAGE - 1) & -PAGE) - (o & -PAGE)) for d, o, n in ranges if n > 0
    ):
        last = spans[-1] if spans else None
        if last is not None and last[0] == device and offset <= last[1] + last[2]:
            last[2] = max(last[2], offset + length - last[1])
        else:
            spans.append([device, offset, length])
    return tuple((d, o, n) for d, o, n in spans)


def overlaps(spans: tuple[Span, ...], device: int, offset: int, length: int) -> bool:
    """Does any span hold a byte of device `device`'s `[offset, offset + length)`?"""
    return any(d == device and o < offset + length and offset < o + n for d, o, n in spans)


# ---- untrusted reports ---------------------------------------------------------------------------
class BadReport(Exception):
    """A kernel process sent something that is not a report it may send."""


def encode_results(results: list) -> bytes:
    return json.dumps(["results", [list(result) for result in results]]).encode()


def encode_accesses(packed: tuple) -> bytes:
    token, entries, fault = packed
    return json.dumps(["accesses", token, entries, fault]).encode()


def decode_report(data: bytes, expected: list[int], sent_ns: int) -> Any:
    """A kernel process's report as the scheduler takes it: the list of result tuples of
    the batch (their tokens exactly `expected`, in order; times clamped to since the batch
    was sent; messages cut to MAX_MESSAGE characters, any lone surrogate replaced, device
    output cut to MAX_OUTPUT characters) or the
    packed `Accesses` of one of its tokens. Raises BadReport."""
    try:
        report = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise BadReport(f"not JSON: {error}") from None
    if not isinstance(report, list) or not report:
        raise BadReport("not a report")
    if report[0] == "results" and len(report) == 2 and isinstance(report[1], list):
        return _results(report[1], expected, sent_ns)
    if report[0] == "accesses" and len(report) == 4:
        return _accesses(report[1], report[2], report[3], expected)
    raise BadReport("not a report")


_KERNEL_CODES = (0, codes.ACL_ERROR_RT_AICORE_EXCEPTION, codes.ACL_ERROR_RT_DEVICE_MEM_ERROR)


def _is_int(value: object) -> bool:
    return value.__class__ is int


def _results(results: list, expected: list[int], sent_ns: int) -> list[tuple]:
    if len(results) != len(expected):
        raise BadReport(f"{len(results)} results for a batch of {len(expected)} kernels")
    now = time.monotonic_ns()
    out = []
    for result, token in zip(results, expected):
        if not (isinstance(result, list) and len(result) == 8):
            raise BadReport(
                "a result is not (token, code, start, end, message, output, overflow, failed)"
            )
        got, code, start, end, message, output, overflow, failed = result
        if (
            got != token
            or not all(map(_is_int, (code, start, end, failed)))
            or overflow.__class__ is not bool
        ):
            raise BadReport("a result names another task or is not numbers")
        if not isinstance(message, str) or not isinstance(output, str):
            raise BadReport("a result's message or output is not text")
        if code not in _KERNEL_CODES:
            code = codes.ACL_ERROR_RT_AICORE_EXCEPTION
        start = min(max(start, sent_ns), now)
        end = min(max(end, start), now)
        if message:  # a lone surrogate could not go into the client's reply: "?" instead
            message = message[:MAX_MESSAGE].encode("utf-8", "replace").decode("utf-8")
        out.append((token, code, start, end, message, output[:MAX_OUTPUT], overflow, failed))
    return out


def _accesses(token: object, entries: object, fault: object, expected: list[int]) -> tuple:
    if token not in expected or not isinstance(entries, list):
        raise BadReport("accesses of another task")
    checked = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 5 and all(map(_is_int, entry))):
            raise BadReport("an access is not (lo, hi, write, first block, last block)")
        checked.append(tuple(entry))
    if fault is not None:
        if not (
            isinstance(fault, list)
            and len(fault) == 4
            and _is_int(fault[0])
            and _is_int(fault[1])
            and fault[2] in ("r", "w", "rw")
            and _is_int(fault[3])
        ):
            raise BadReport("a fault is not (address, bytes, access, block)")
        fault = tuple(fault)
    return Accesses.pack(token, checked, fault)


# ---- the zygote (trusted: it never runs user code) -----------------------------------------------
def zygote_main(conn: Connection, device_segments: list[str], scratch_root: str) -> None:
    """Entry point of the spawned zygote: open the device segments, import what kernels
    use, then fork a kernel process per request (its scratch directory in `scratch_root`)."""
    from simnpu.server.units import workers

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    daemon_pid = workers.end_with_daemon(lambda: shutil.rmtree(scratch_root, True))
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one core each
    import numpy  # noqa: F401 - kernels use it: imported once, shared by every fork

    import simnpu  # noqa: F401 - the `kernel` decorator kernels import

    memories = [posix_ipc.SharedMemory(name) for name in device_segments]
    readable = _readable_directories()
    ended: dict[int, int] = {}  # pid -> wait status, of kernel processes reaped

    def reap(signum: int, frame: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ended[pid] = status
            shutil.rmtree(os.path.join(scratch_root, str(pid)), True)
            while len(ended) > 4096:
                del ended[next(iter(ended))]

    signal.signal(signal.SIGCHLD, reap)
    conn.send(("ready", sandbox.unavailable()))
    while True:
        try:
            request = conn.recv()
        except DAEMON_GONE:  # the daemon died (SIGKILL): its death signal may come too late
            shutil.rmtree(scratch_root, True)  # to clean up before this process has ended
            break
        if request is None:
            break
        if request[0] == "fork":
            _, core_id, spans, mappings, notify = request
            sock = reduction.recv_handle(conn)
            try:
                pid = os.fork()
            except OSError as error:
                os.close(sock)
                conn.send(("error", f"fork failed: {error}"))
                continue
            if pid == 0:
                code = 1
                try:
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    conn.close()
                    scratch = os.path.join(scratch_root, str(os.getpid()))
                    os.mkdir(scratch, 0o700)
                    _kernel_process(
                        sock, core_id, spans, mappings, notify, memories, readable, scratch
                    )
                    code = 0
                finally:
                    os._exit(code)
            os.close(sock)
            pidfd = os.pidfd_open(pid)
            conn.send(("forked", pid))
            reduction.send_handle(conn, pidfd, daemon_pid)
            os.close(pidfd)
        else:  # ("ended", pid): how it ended, once reaped
            pid = request[1]
            deadline = time.monotonic() + END_WAIT_S
            while pid not in ended and time.monotonic() < deadline:
                reap(signal.SIGCHLD, None)
                time.sleep(0.005)
            conn.send(("ended", ended.pop(pid, None)))


def _readable_directories() -> tuple[str, ...]:
    """Where a kernel process may read (and map, and run) files: the Python installation
    and the daemon's import path (the daemon never imports from its working directory)."""
    places = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    places.update(path for path in sys.path if path and os.path.isdir(path))
    import simnpu.server

    places.add(os.path.dirname(os.path.dirname(os.path.abspath(simnpu.server.__file__))))
    return tuple(sorted(places))


# ---- a kernel process (untrusted once it has run a kernel) ---------------------------------------
def map_windows(
    fds: list[int], spans: Iterable[Span], mappings: Iterable[Mapping] = ()
) -> list[Any]:
    """One window per device (simnpu.shm.window), PROT_NONE but for the spans of the
    device's segment (descriptor `fds[device]`), mapped shared at their own offsets, and
    the mappings (device, reserved offset, length, source offset, source) at their reserved
    offsets: a buffer per device that kernels' views index like the device's address span.
    A host segment gone meanwhile (unregistered) stays PROT_NONE: touching it faults."""
    bases = [window.reserve() for _ in fds]
    for device, offset, length in spans:
        window.map_shared(bases[device], fds[device], [(offset, length, offset)])
    for device, offset, length, file_offset, source in mappings:
        if source == window.OWN:
            window.map_shared(bases[device], fds[device], [(offset, length, file_offset)])
        else:
            window.map_segment(bases[device], source, [(offset, length, file_offset)])
    return [(ctypes.c_char * DEVICE_SPAN).from_address(base) for base in bases]


def _kernel_process(
    sock: int,
    core_id: int,
    spans: tuple[Span, ...],
    mappings: tuple[Mapping, ...],
    notify: str | None,
    memories: list,
    readable: tuple[str, ...],
    scratch: str,
) -> None:
    from simnpu.server.units.workers import WorkRunner
    from simnpu.shm.notify import NotifyArea
    from simnpu.shm.region import Region

    maps = map_windows([memory.fd for memory in memories], spans, mappings)
    area = NotifyArea(Region.attach(notify).map) if notify else None
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never into the daemon's log (a kernel module's print is device
        # printf: its output travels in the results, server/units/device_printf.py)
        os.dup2(null, fd)
    os.closerange(3, sock)
    os.closerange(sock + 1, os.sysconf("SC_OPEN_MAX"))
    with open("/proc/self/statm") as statm:
        in_use = int(statm.read().split()[0]) * PAGE
    sandbox.enter(
        sandbox.Policy(
            readable=readable,
            scratch=scratch,
            parent=os.getppid(),
            address_space=in_use + KERNEL_MEMORY,
        )
    )
    os.chdir(scratch)
    conn = Connection(sock)

    def report(packed: object) -> None:
        assert isinstance(packed, tuple), "the packed Accesses of a checked kernel"
        conn.send_bytes(encode_accesses(packed))

    runner = WorkRunner(core_id, maps, [], report)
    watch_numpy(runner.overflow)  # a kernel's float overflow raises the flag
    if notify is not None and area is not None:
        runner.signals[notify] = area
    incoming = select.poll()
    incoming.register(sock, select.POLLIN)
    cancelled: set[int] = set()

    def take_cancellations() -> set[int]:
        while incoming.poll(0):
            try:
                message = conn.recv()
            except DAEMON_GONE:
                message = None
            if message is None:  # the daemon asks this process to stop (or is gone)
                raise SystemExit(0)
            cancelled.update(message.tokens)
        return cancelled

    while True:
        try:
            batch = next_message(conn, incoming)
        except DAEMON_GONE:
            return
        if batch is None:
            return
        if isinstance(batch, Cancel):
            continue
        cancelled.clear()
        try:
            conn.send_bytes(encode_results(runner.run(batch, take_cancellations)))
        finally:
            runner.wake_clients()


# ---- the daemon's side ---------------------------------------------------------------------------
class KernelProcess:
    """One kernel process as the daemon sees it."""

    __slots__ = (
        "busy",
        "conn",
        "doomed",
        "generation",
        "hung_up",
        "loaded",
        "owner",
        "pid",
        "pidfd",
        "sent_ns",
        "spans",
        "tokens",
        "unit",
    )

    def __init__(
        self, owner: Any, unit: Unit, conn: Connection, pid: int, pidfd: int, grant: Grant
    ):
        self.owner = owner
        self.unit = unit
        self.busy = False  # it runs a batch
        self.doomed = False  # memory it maps was freed: it ends after its batch
        self.hung_up = False  # its socket was found closed: it is exiting by itself
        self.conn = conn
        self.pid = pid
        self.pidfd = pidfd
        self.generation = grant.generation
        self.spans = grant.spans
        self.loaded: set[int] = set()  # binaries whose module it has executed
        self.tokens: list[int] = []  # of the batch it runs
        self.sent_ns = 0

    def kill(self) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def gone(self, timeout_s: float) -> bool:
        """Wait until the process has exited (its memory unmapped), up to `timeout_s`."""
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))


class KernelProcesses:
    """The daemon's kernel processes and their zygote. `lock` orders every change of which
    process maps what against frees of device memory (Device.free takes it first)."""

    def __init__(self, device_segments: list[str]):
        self._segments = device_segments
        self.lock = threading.RLock()
        self._by_key: dict[tuple[int, Unit], KernelProcess] = {}
        self._zygote: Any = None
        self._conn: Connection | None = None
        self._scratch = (
            ""  # the zygote's scratch root (kernel process `pid` writes in <root>/<pid>)
        )
        self.version = 0  # bumped whenever a process comes or goes (the executor's poll set)
        # frees waiting for busy processes that map the block: (those processes, release)
        self._deferred: list[tuple[set[KernelProcess], Callable[[], object]]] = []

    def start(self) -> None:
        """Make the scratch root, spawn the zygote and wait until it is ready. Blocks."""
        self._scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        missing = self._spawn()
        if missing:
            log.warning(
                "kernel processes run without %s: this machine lacks it "
                "(docs/kernel-isolation.md, docs/security.md)",
                " and ".join(missing),
            )

    def _spawn(self) -> list[str]:
        """A new zygote; what of the sandbox this machine lacks. It is started from a thread
        of its own that lives until the zygote is replaced or stopped: a child's death
        signal (PR_SET_PDEATHSIG) comes when the thread that started it ends, and the
        caller may be a session's thread."""
        started: queue.SimpleQueue = queue.SimpleQueue()
        retire = self._retire = threading.Event()

        def keeper() -> None:
            try:
                started.put(self._start_zygote())
            except BaseException as error:  # noqa: BLE001 - raised by the caller
                started.put(error)
            retire.wait()

        threading.Thread(target=keeper, name="simnpu-zygote-keeper", daemon=True).start()
        result = started.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _start_zygote(self) -> list[str]:
        spawn = multiprocessing.get_context("spawn")
        parent, child = spawn.Pipe()
        self._zygote = spawn.Process(
            target=zygote_main,
            args=(child, self._segments, self._scratch),
            name="simnpu-kernel-zygote",
            daemon=True,
        )
        self._zygote.start()
        child.close()
        self._conn = parent
        try:
            if not parent.poll(START_TIMEOUT_S):
                raise OSError(f"the kernel zygote did not start within {START_TIMEOUT_S:.0f} s")
            _, missing = parent.recv()
        except EOFError:
            raise OSError(
                f"the kernel zygote {_exit_of(self._zygote.exitcode)} as it started"
            ) from None
        return missing

    def _respawn(self) -> None:
        """The zygote died (its kernel processes die with it): start another."""
        assert self._conn is not None and self._zygote is not None, "started"
        self._conn.close()
        self._zygote.join(EXIT_WAIT_S)
        if self._zygote.is_alive():
            self._zygote.kill()
            self._zygote.join(END_WAIT_S)
        log.error("the kernel zygote %s; starting another", _exit_of(self._zygote.exitcode))
        self._retire.set()
        shutil.rmtree(self._scratch, True)
        os.mkdir(self._scratch, 0o700)
        self._spawn()

    def _ask(self, request: tuple, send_fd: int | None = None) -> tuple:
        """Send `request` (and the descriptor `send_fd`) to the zygote, return its answer;
        a dead zygote is replaced and asked once more. Raises OSError if that fails too."""
        for attempt in (1, 2):
            assert self._conn is not None and self._zygote is not None, "started"
            try:
                self._conn.send(request)
                if send_fd is not None:
                    reduction.send_handle(self._conn, send_fd, self._zygote.pid)
                reply = self._conn.recv()
                if reply[0] == "forked":
                    reply = (*reply, reduction.recv_handle(self._conn))
                return reply
            except (EOFError, OSError) as error:
                if attempt == 2:
                    raise OSError(f"the kernel zygote failed: {error}") from None
                try:
                    self._respawn()
                except OSError as again:
                    raise OSError(f"the kernel zygote failed: {again}") from None
        raise AssertionError("unreachable")

    def process_for(self, owner: Any, unit: Unit) -> tuple[KernelProcess, bool]:
        """The kernel process that runs `owner`'s kernels on `unit`, and whether it is new:
        made now if there is none, or if `owner`'s memory changed since it was made."""
        with self.lock:
            key = (owner.id, unit)
            grant_of = owner.kernel_grant
            assert grant_of is not None, "a session's owner knows its memory"
            grant = grant_of()
            process = self._by_key.get(key)
            if process is not None:
                if process.generation == grant.generation and not process.doomed:
                    return process, False
                self._end(key)
            process = self._fork(owner, unit, grant)
            self._by_key[key] = process
            self.version += 1
            return process, True

    def _fork(self, owner: Any, unit: Unit, grant: Grant) -> KernelProcess:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        notify = owner.signals.name if owner.signals is not None else None
        try:
            reply = self._ask(
                ("fork", unit.core_id, grant.spans, grant.mappings, notify), theirs.fileno()
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        if reply[0] != "forked":
            ours.close()
            raise OSError(f"no kernel process for {owner!r}: {reply[1]}")
        _, pid, pidfd = reply
        return KernelProcess(owner, unit, Connection(ours.detach()), pid, pidfd, grant)

    def _end(self, key: tuple[int, Unit]) -> KernelProcess | None:
        """End the process of `key` and wait until it is gone (caller holds the lock): one
        that hung up may take EXIT_WAIT_S to exit by itself (so its own exit status tells
        how it ended), then it is killed."""
        process = self._by_key.pop(key, None)
        if process is not None:
            self.version += 1
            if not (process.hung_up and process.gone(EXIT_WAIT_S)):
                process.kill()
                process.gone(END_WAIT_S)
            process.conn.close()
            os.close(process.pidfd)
            self._settle(process)
        return process

    def _settle(self, ended: KernelProcess) -> None:
        """Release the blocks whose last mapping went with `ended`."""
        still = []
        for holders, release in self._deferred:
            holders.discard(ended)
            if holders:
                still.append((holders, release))
            else:
                release()
        self._deferred = still

    def freeing(self, device: int, offset: int, length: int, release: Callable[[], object]) -> bool:
        """Device memory `[offset, +length)` of `device` is to be freed (aclrtFree does not
        wait for tasks): end every idle kernel process that maps a page of it. True: free
        it now; False: a busy one maps it too -- it ends when its batch is done, and
        `release` frees the block then (caller holds the lock)."""
        busy = set()
        for key, process in list(self._by_key.items()):
            if overlaps(process.spans, device, offset, length):
                if process.busy:
                    process.doomed = True
                    busy.add(process)
                else:
                    self._end(key)
        if busy:
            self._deferred.append((busy, release))
        return not busy

    def batch_done(self, process: KernelProcess) -> None:
        """`process` reported its batch: it is idle, or ends now if memory it maps was freed
        meanwhile."""
        with self.lock:
            process.busy = False
            if process.doomed:
                self._end((process.owner.id, process.unit))

    def end_owner(self, owner_id: int) -> None:
        """A client is gone, or closed an IPC import: end its kernel processes -- those
        running a batch once it is done (its session's are cancelled, docs/architecture.md)."""
        with self.lock:
            for key, process in list(self._by_key.items()):
                if key[0] == owner_id:
                    if process.busy:
                        process.doomed = True
                    else:
                        self._end(key)

    def lost(self, process: KernelProcess) -> str:
        """`process` died, is stuck or misbehaved: end it, say how it ended. Blocks until
        it is gone."""
        with self.lock:
            key = (process.owner.id, process.unit)
            if self._by_key.get(key) is process:
                self._end(key)
            try:
                status = self._ask(("ended", process.pid))[1]
            except OSError:  # the zygote died with it: that is how it ended
                return "ended with the kernel zygote"
        return describe_status(status)

    @property
    def mapped(self) -> bool:
        """Does any kernel process map device memory now?"""
        return bool(self._by_key)

    def processes(self) -> list[KernelProcess]:
        """Every live kernel process (for the executor's poll)."""
        with self.lock:
            return list(self._by_key.values())

    def stop(self) -> None:
        """End every kernel process and the zygote, remove the scratch root. Blocks."""
        with self.lock:
            for key in list(self._by_key):
                self._end(key)
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
        if self._zygote is not None:
            self._zygote.join(END_WAIT_S)
            if self._zygote.is_alive():
                self._zygote.kill()
                self._zygote.join(END_WAIT_S)
        if self._conn is not None:
            self._conn.close()
        self._retire.set()
        if self._scratch:
            shutil.rmtree(self._scratch, True)


def _exit_of(code: int | None) -> str:
    if code is None:
        return "did not end"
    if code < 0:
        return describe_status(-code)  # a signal number is its own wait status
    return f"exited with code {code}"


def describe_status(status: int | None) -> str:
    """How a kernel process ended, from its wait status."""
    if status is None:
        return "ended (how is unknown)"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"was killed by signal {number} ({signal.Signals(number).name})"
        except ValueError:
            return f"was killed by signal {number}"
    return f"exited with code {os.WEXITSTATUS(status)}"
