"""Malloc settings for in-stream copies: freed big blocks stay in the heap for the next ones.

In-stream copies move megabytes per gRPC message, and each message is a fresh buffer (gRPC's
receive path, the encoded reply). By default glibc hands big freed blocks back to the kernel
at once, so every chunk would land in pages faulted in anew, at several times the cost of
copying into warm memory. With these thresholds they are kept and reused. They are where
glibc's own adaptive thresholds end up after big blocks were freed; setting them only
skips the adapting. The daemon sets them always; a client only when its copies travel
in-stream (it does not share the daemon's /dev/shm).
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks smaller than this come from the heap (glibc's own upper bound)
TRIM_THRESHOLD = 64 << 20  # free bytes at the top of a heap kept before they go back


def keep_freed_memory() -> bool:
    """Set both thresholds with mallopt(3) for this process; False where the C library has
    no mallopt or refuses them (the daemon works the same, slower)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
