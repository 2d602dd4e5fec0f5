"""The host's limit on device memory: how much more of it the host can back with pages.

Device memory is committed as it is allocated (docs/device-memory.md), so an allocation
must fit in what the host has left: the free space of /dev/shm, where the segments live,
and MemAvailable less a reserve for the rest of the host. `HostMemory.check` refuses what
does not fit with 207001 (ACL_ERROR_RT_MEMORY_ALLOCATION), naming the host limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from simnpu.proto.errors import NpuMemoryError
from simnpu.shm.region import shm_available_bytes

FRESH_FOR = 2 << 20  # requests from this size on read the host's figures afresh
MAX_AGE_S = 0.1  # smaller ones use a reading this recent, less what was committed since
MAX_RESERVE = 1 << 30  # MemAvailable kept for the rest of the host: this, or 1/16 of it


def reserve_of(total: int) -> int:
    """The bytes of MemAvailable the daemon leaves to the rest of a host of `total` bytes."""
    return min(MAX_RESERVE, total // 16)


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes."""
    figures: dict[str, int] = {}
    with open(path, "rb") as handle:
        for line in handle:
            name, _, rest = line.partition(b":")
            if name in (b"MemTotal", b"MemAvailable"):
                figures[name.decode()] = int(rest.split()[0]) * 1024
    return figures["MemTotal"], figures["MemAvailable"]


def _mib(n: int) -> str:
    return f"{n} B ({n / (1 << 20):.2f} MiB)"


class HostMemory:
    """The daemon's view of the host's memory; thread-safe (sessions allocate concurrently)."""

    def __init__(
        self, shm_directory: str = "/dev/shm", clock: Callable[[], float] = time.monotonic
    ):
        self.shm_directory = shm_directory
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at = -1.0  # monotonic time of the last reading
        self._shm = self._memory = 0  # what the last reading left, less commits since

    def check(self, size: int) -> None:
        """Commit of `size` bytes of device memory is about to happen: account for it, or
        raise NpuMemoryError (207001) naming the host limit it would pass."""
        with self._lock:
            now = self._clock()
            if size >= FRESH_FOR or now - self._read_at > MAX_AGE_S or size > self._headroom():
                self._read(now)
            if size > self._headroom():
                raise NpuMemoryError(self._message(size))
            self._shm -= size
            self._memory -= size

    def _headroom(self) -> int:
        return min(self._shm, self._memory)

    def _read(self, now: float) -> None:
        total, available = read_meminfo()
        self._shm = shm_available_bytes(self.shm_directory)
        self._memory = available - reserve_of(total)
        self._read_at = now

    def _message(self, size: int) -> str:
        asked = f"out of host memory for device memory: asked {_mib(size)} reserved; "
        if self._shm < size:
            return (
                asked + f"{self.shm_directory} has {_mib(max(self._shm, 0))} free "
                "(enlarge it, docker: shm_size)"
            )
        return (
            asked + f"the host has {_mib(max(self._memory, 0))} available "
            "(MemAvailable less the reserve kept for the rest of the host)"
        )


def committed_failure(size: int, error: OSError) -> NpuMemoryError:
    """207001 for a commit the host refused after the check passed (another process took
    the memory meanwhile)."""
    return NpuMemoryError(
        f"out of host memory for device memory: backing {_mib(size)} with pages failed "
        f"({error.strerror or error}); /dev/shm or the host's memory is short"
    )
