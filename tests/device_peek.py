"""What a test reads of device memory without asking the daemon: the bytes at a device
address, straight from the daemon's device segment, attached read-only.

Trusted test code only. Kernels cannot write files any more, so a kernel that must leave
a trace writes it into a device buffer and the test reads it here, also while the client
that launched it is stopped, interrupted or gone.
"""

from __future__ import annotations

import mmap

import posix_ipc

from simnpu.shm.addresses import split_device_address
from simnpu.shm.region import NAME_PREFIX


def device_segment(daemon_pid: int, device: int) -> str:
    """The name of the memory segment of `device` of the daemon `daemon_pid`."""
    return f"{NAME_PREFIX}-{daemon_pid}-dev{device}"


def peek(daemon_pid: int, address: int, nbytes: int) -> bytes:
    """The `nbytes` bytes of device memory at device address `address` of the daemon
    `daemon_pid`, as they are now."""
    device, offset = split_device_address(address)
    memory = posix_ipc.SharedMemory(device_segment(daemon_pid, device), read_only=True)
    try:
        if offset + nbytes > memory.size:
            raise ValueError(
                f"{nbytes} bytes at {address:#x} run past device {device}'s {memory.size} bytes"
            )
        with mmap.mmap(memory.fd, memory.size, mmap.MAP_SHARED, mmap.PROT_READ) as view:
            return view[offset : offset + nbytes]
    finally:
        memory.close_fd()
