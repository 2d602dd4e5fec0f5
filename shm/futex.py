"""Linux futexes on shared memory, through ctypes: a process sleeps on a 32-bit word until
another process (or thread) changes it and wakes it.

Used by the notify area (simnpu.shm.notify): the daemon and its workers wake a client
thread directly when its reply or its stream's completion is written. The operations are
the process-shared ones (no FUTEX_PRIVATE_FLAG), so they work across every process that
maps the same segment. `AVAILABLE` is False where the system call number is not known
(not Linux on x86-64 or aarch64); callers then use the gRPC stream instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 0x7FFFFFFF

AVAILABLE = _SYS_FUTEX is not None and os.uname().sysname == "Linux"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


if AVAILABLE:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
    _syscall.argtypes = [
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the u32 at `address` holds `expected`, for at most `timeout_s` seconds.

    Returns when woken, when the word differs (at once), on a signal or at the timeout:
    callers re-check their condition in a loop. Releases the GIL while asleep.
    """
    whole = int(timeout_s)
    timeout = _Timespec(whole, int((timeout_s - whole) * 1e9))
    if (
        _syscall(
            _SYS_FUTEX,
            address,
            _FUTEX_WAIT,
            expected & 0xFFFFFFFF,
            ctypes.addressof(timeout),
            None,
            0,
        )
        < 0
    ):
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(code, f"futex wait: {os.strerror(code)}")


def wake(address: int) -> None:
    """Wake every thread of any process sleeping on the u32 at `address`. Never blocks."""
    _syscall(_SYS_FUTEX, address, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
