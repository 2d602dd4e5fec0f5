"""The daemon's book of kernel processes: a client's own kernels run in processes of that
client alone, which map only that client's device memory (docs/kernel-isolation.md).

The daemon never forks (it is multi-threaded: gRPC lives in it): it spawns a trusted
*zygote* (server/units/zygote_main.py), which forks the kernel processes
(server/units/kernel_process_main.py) it asks for and reaps them. What a kernel process
sends back is untrusted: the executor checks it (server/units/report_codec.py) before the
scheduler sees it.

`KernelProcesses` keeps one process per (client, AI core) that ran the client's kernels;
made again when the client's memory changed since it was made (the grant's generation);
ended -- and waited for -- before memory it maps is freed, so no page reaches another client
while a kernel process still maps it; ended when the client goes.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from simnpu.server.core.rate_limits import log_about
from simnpu.server.core.unit_protocol import Grant, PageSpan
from simnpu.server.units import kernel_bounds
from simnpu.server.units.report_channel import ReportChannel
from simnpu.server.units.spawning import clean_environment

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit

log = logging.getLogger("simnpu.kernels")

START_TIMEOUT_S = 60.0
SCRATCH_PREFIX = "simnpu-kernels-"
"""The zygote's scratch root, in the temporary directory: this, the daemon's pid, "-", and a
random part; kernel process `pid` writes in `<root>/<pid>` only."""
END_WAIT_S = 5.0  # how long a killed kernel process may take to be gone
ZYGOTE_EXIT_WAIT_S = 2.0  # how long a zygote found gone has to exit by itself
ZYGOTE_MAIN = "simnpu.server.units.zygote_main"
"""The zygote's program (`python -P -m`, in a clean environment: never imported here)."""


def overlaps(spans: tuple[PageSpan, ...], device: int, offset: int, length: int) -> bool:
    """Does any span hold a byte of device `device`'s `[offset, offset + length)`?"""
    return any(d == device and o < offset + length and offset < o + n for d, o, n in spans)


class KernelProcess:
    """One kernel process as the daemon sees it."""

    __slots__ = (
        "busy",
        "conn",
        "doomed",
        "ended_because",
        "generation",
        "hung_up",
        "loaded",
        "owner",
        "pid",
        "pidfd",
        "sent_ns",
        "spans",
        "threads",
        "tokens",
        "unit",
    )

    def __init__(
        self, owner: Any, unit: Unit, conn: ReportChannel, pid: int, pidfd: int, grant: Grant
    ):
        self.owner = owner
        self.unit = unit
        self.busy = False  # it runs a batch
        self.doomed = False  # memory it maps was freed: it ends after its batch
        self.hung_up = False  # its socket was found closed: it exits, or its kernel closed it
        self.ended_because: str | None = None  # the daemon killed it while it ran a batch
        self.conn = conn  # its socket, read and written without blocking
        self.pid = pid
        self.pidfd = pidfd
        self.threads = kernel_bounds.open_threads(pid)  # its thread folder, to count them
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

    def __init__(self, devices: int):
        self._devices = devices
        self.lock = threading.RLock()
        self._by_key: dict[tuple[int, Unit], KernelProcess] = {}
        self._zygote: subprocess.Popen | None = None
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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._zygote = subprocess.Popen(
                [sys.executable, "-P", "-m", ZYGOTE_MAIN, str(theirs.fileno())],
                env=clean_environment(),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        parent = self._conn = Connection(ours.detach())
        try:
            parent.send((self._devices, self._scratch))
            if not parent.poll(START_TIMEOUT_S):
                raise OSError(f"the kernel zygote did not start within {START_TIMEOUT_S:.0f} s")
            _, missing = parent.recv()
        except (EOFError, BrokenPipeError):
            _end_zygote(self._zygote, END_WAIT_S)
            raise OSError(
                f"the kernel zygote {_exit_of(self._zygote.returncode)} as it started"
            ) from None
        return missing

    def _respawn(self) -> None:
        """The zygote died (its kernel processes die with it): start another."""
        assert self._conn is not None and self._zygote is not None, "started"
        self._conn.close()
        _end_zygote(self._zygote, ZYGOTE_EXIT_WAIT_S)
        log.error("the kernel zygote %s; starting another", _exit_of(self._zygote.returncode))
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
                if (
                    process.generation == grant.generation
                    and not process.doomed
                    and not process.hung_up
                ):
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
            reply = self._ask(("fork", unit.core_id, grant.mappings, notify), theirs.fileno())
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        if reply[0] != "forked":
            ours.close()
            raise OSError(f"no kernel process for {owner!r}: {reply[1]}")
        _, pid, pidfd = reply
        try:
            return KernelProcess(owner, unit, ReportChannel(ours), pid, pidfd, grant)
        except OSError as error:  # it died at once: its thread folder is gone
            ours.close()
            os.close(pidfd)
            raise OSError(f"no kernel process for {owner!r}: {error}") from None

    def _end(self, key: tuple[int, Unit]) -> KernelProcess | None:
        """Kill the process of `key` and wait until it is gone (caller holds the lock: the
        wait is that of a SIGKILL, not of anything the kernel does). One that hung up was
        given its time to exit by itself before (the executor polls its pidfd meanwhile);
        if it is exiting now it keeps its own exit status: the kernel drops a signal sent
        to a process that is exiting."""
        process = self._by_key.pop(key, None)
        if process is not None:
            self.version += 1
            process.kill()
            process.gone(END_WAIT_S)
            process.conn.close()
            os.close(process.pidfd)
            os.close(process.threads)
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
        meanwhile or its kernel left threads running (the next batch gets a new one)."""
        with self.lock:
            process.busy = False
            if process.doomed:
                self._end((process.owner.id, process.unit))
            elif kernel_bounds.threads_in(process.threads) > 1:  # its kernel left threads running
                log_about(  # at the client's rate (server/core/rate_limits.py)
                    process.owner,
                    log,
                    logging.INFO,
                    "the kernel process of %r left threads running after its batch; ending it",
                    process.owner,
                )
                self._end((process.owner.id, process.unit))

    def end_owner(self, owner_id: int, *, running_too: bool = False) -> None:
        """A client closed an IPC import: end its kernel processes -- those running a batch
        once it is done. `running_too`: the client is gone, and a process running a batch
        is killed now (a client may have let its kernels run for ever,
        aclrtSetOpExecuteTimeOut): its unit reports it lost and is free at once."""
        with self.lock:
            for key, process in list(self._by_key.items()):
                if key[0] == owner_id:
                    if not process.busy:
                        self._end(key)
                        continue
                    process.doomed = True
                    if running_too:
                        process.ended_because = "was ended with its client's session"
                        process.kill()  # the executor reads its end, then `lost` ends it

    def lost(self, process: KernelProcess) -> str:
        """`process` died, is stuck or misbehaved: end it, say how it ended. Blocks until
        it is gone."""
        with self.lock:
            key = (process.owner.id, process.unit)
            if self._by_key.get(key) is process:
                self._end(key)
            if process.ended_because is not None:
                return process.ended_because
            try:
                _, status, breached = self._ask(("ended", process.pid))
            except OSError:  # the zygote died with it: that is how it ended
                return "ended with the kernel zygote"
        if breached is not None:
            return f"was killed by its zygote: it {breached}"
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
            _end_zygote(self._zygote, END_WAIT_S)
        if self._conn is not None:
            self._conn.close()
        self._retire.set()
        if self._scratch:
            shutil.rmtree(self._scratch, True)


def _end_zygote(zygote: subprocess.Popen, timeout_s: float) -> None:
    """Reap the zygote: it has `timeout_s` to exit by itself, then it is killed."""
    try:
        zygote.wait(timeout_s)
    except subprocess.TimeoutExpired:
        zygote.kill()
        zygote.wait(END_WAIT_S)


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
