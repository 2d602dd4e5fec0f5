"""What a process the daemon spawned does to live and end with it: the workers, the kernel
zygote and the Gloo exchange processes call these first. Never imported by the daemon.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import types
from collections.abc import Callable

from simnpu.shm.region import unlink_daemon_segments

GROUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # what a signal to the daemon's group sends


def ignore_group_signals() -> None:
    """The daemon decides when its children stop: a Ctrl-C or SIGTERM to its process group
    is the daemon's alone. Unblocks them after (a worker is born with them blocked, so that
    one still booting does not die of them either)."""
    for signum in GROUP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, GROUP_SIGNALS)


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies
_DAEMON_EXIT_WAIT_MS = 2000  # how long a dying daemon's last threads may take to end


def end_with_daemon(cleanup: Callable[[], None] = lambda: None) -> int:
    """From now on this worker ends when the daemon does, even in the middle of a kernel
    (prctl PR_SET_PDEATHSIG): the signal is SIGUSR2, which nobody else sends (SIGTERM and
    SIGINT to the daemon's process group are ignored: the daemon stops its workers itself);
    its handler first unlinks the segments of a daemon that died without stopping its
    workers (SIGKILL), after `cleanup`, then ends the worker as the signal would.
    Returns the daemon's pid.

    The signal comes whenever the daemon's thread that is this worker's parent ends (the
    kernel then makes another of its threads the parent, and signals again when that one
    ends). Workers start from whatever thread needed them (a session's, naming a device
    for the first time; the scheduler's, replacing a worker), so a signal while this
    process's parent is still the daemon is only a thread ending, and is ignored; once the
    daemon's last thread has ended, the parent is a process outside it. The handler asks
    nothing but getppid before it decides: a burst of these signals comes while a killed
    daemon's threads end, and it may run again inside itself."""
    parent = multiprocessing.parent_process()
    daemon_pid = parent.pid if parent is not None and parent.pid else os.getppid()
    try:
        pidfd = os.pidfd_open(daemon_pid)
    except ProcessLookupError:  # it died (and was reaped) before this worker came up
        unlink_daemon_segments(daemon_pid)
        raise SystemExit(0) from None
    daemon = select.poll()  # readable once every thread of the daemon has ended
    daemon.register(pidfd, select.POLLIN)

    def daemon_ended(signum: int, frame: types.FrameType | None) -> None:
        if os.getppid() == daemon_pid:
            return  # one of the daemon's threads ended, not the daemon
        signal.signal(signum, signal.SIG_IGN)  # once: the signal may come again meanwhile
        try:
            cleanup()
            if daemon.poll(_DAEMON_EXIT_WAIT_MS):
                unlink_daemon_segments(daemon_pid)
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGUSR2, daemon_ended)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR2, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != daemon_pid:  # it died before the signal was armed
        daemon_ended(signal.SIGUSR2, None)
    return daemon_pid
