"""The kernel zygote: a trusted process that forks a client's kernel processes.

The daemon never forks (it is multi-threaded: gRPC lives in it). It starts this program at
start (`python -P -m simnpu.server.units.zygote_main FD`, from
server/units/kernel_processes.py) in a clean environment (`spawning.clean_environment`:
nothing of the daemon's reaches a kernel); it imports numpy and the kernel runner, and
learns the number of devices and its scratch root first on the socket FD; over that socket the
daemon asks it to fork a kernel process (server/units/kernel_process_main.py) for a unit,
a grant and a notify area, passing the new process's socket with the request, and how one
it reaped ended. It looks at its kernel processes every `kernel_bounds.WATCH_S` and kills
one over a bound of threads or scratch files (server/units/kernel_bounds.py). It never runs
user code (docs/kernel-isolation.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection

from simnpu.server.core.unit_protocol import DAEMON_GONE
from simnpu.server.units import kernel_bounds, kernel_process_main, sandbox
from simnpu.server.units.daemon_child import end_with_daemon, ignore_group_signals

REAP_WAIT_S = 5.0  # how long a kernel process asked about may take to be reaped


def main(conn: Connection) -> None:
    """The zygote, from the daemon's first message on `conn` (the number of devices and
    the scratch root) to its end: import what kernels use, then fork a kernel process per
    request (its scratch directory in the scratch root). It maps no device memory: each
    kernel process maps its own client's."""
    ignore_group_signals()
    devices, scratch_root = conn.recv()
    daemon_pid = end_with_daemon(lambda: shutil.rmtree(scratch_root, True))
    import numpy  # noqa: F401 - kernels use it: imported once, shared by every fork

    import simnpu  # noqa: F401 - the `kernel` decorator kernels import

    readable = _readable_directories()
    ended: dict[int, int] = {}  # pid -> wait status, of kernel processes reaped
    living: set[int] = set()  # kernel processes not reaped yet
    breached: dict[int, str] = {}  # pid -> why it was killed, of those over a bound

    def reap(signum: int, frame: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ended[pid] = status
            living.discard(pid)
            shutil.rmtree(os.path.join(scratch_root, str(pid)), True)
            while len(ended) > 4096:
                del ended[next(iter(ended))]
            while len(breached) > 4096:
                del breached[next(iter(breached))]

    def watch() -> None:
        """Kill every kernel process over a bound of kernel_bounds."""
        for pid in list(living):
            why = kernel_bounds.breach(pid, os.path.join(scratch_root, str(pid)))
            if why is not None and pid not in breached:
                breached[pid] = why
                os.kill(pid, signal.SIGKILL)  # (a child not reaped yet: its pid is its own)

    signal.signal(signal.SIGCHLD, reap)
    conn.send(("ready", sandbox.unavailable()))
    while True:
        try:
            if living and not conn.poll(kernel_bounds.WATCH_S):
                watch()
                continue
            request = conn.recv()
        except DAEMON_GONE:  # the daemon died (SIGKILL): its death signal may come too late
            shutil.rmtree(scratch_root, True)  # to clean up before this process has ended
            break
        if request is None:
            break
        if request[0] == "fork":
            _, core_id, mappings, notify = request
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
                    kernel_process_main.main(
                        sock, core_id, devices, mappings, notify, readable, scratch
                    )
                    code = 0
                finally:
                    os._exit(code)
            os.close(sock)
            living.add(pid)
            pidfd = os.pidfd_open(pid)
            conn.send(("forked", pid))
            reduction.send_handle(conn, pidfd, daemon_pid)
            os.close(pidfd)
        else:  # ("ended", pid): how it ended, once reaped
            pid = request[1]
            deadline = time.monotonic() + REAP_WAIT_S
            while pid not in ended and time.monotonic() < deadline:
                reap(signal.SIGCHLD, None)
                time.sleep(0.005)
            conn.send(("ended", ended.pop(pid, None), breached.pop(pid, None)))


def _readable_directories() -> tuple[str, ...]:
    """Where a kernel process may read (and map, and run) files: the Python installation
    and the daemon's import path (the daemon never imports from its working directory)."""
    places = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    places.update(path for path in sys.path if path and os.path.isdir(path))
    import simnpu.server

    places.add(os.path.dirname(os.path.dirname(os.path.abspath(simnpu.server.__file__))))
    return tuple(sorted(places))


if __name__ == "__main__":
    main(Connection(int(sys.argv[1])))
