"""What a test reads of device memory without asking the daemon: the bytes at a device
address, straight from the file the daemon maps there, attached read-only.

Trusted test code only. Kernels cannot write files any more, so a kernel that must leave
a trace writes it into a device buffer and the test reads it here, also while the client
that launched it is stopped or interrupted.

A client's blocks live in a file of that client (server/memory/device_backing.py), the
exported pages of a block in a file of that block, mapped
by the daemon at the block's offset of its window of the device; which file backs an
address is read from the daemon's /proc/<pid>/maps: the window is where the device's own
segment is mapped at its own offsets.
"""

from __future__ import annotations

import collections
import mmap
import re

import posix_ipc

from simnpu.shm.addresses import split_device_address
from simnpu.shm.region import NAME_PREFIX


def device_segment(daemon_pid: int, device: int) -> str:
    """The name of the memory segment of `device` of the daemon `daemon_pid`."""
    return f"{NAME_PREFIX}-{daemon_pid}-dev{device}"


def backing_file(daemon_pid: int, device: int, offset: int) -> str:
    """The name of the segment the daemon maps at `offset` of `device`'s memory."""
    own = "/dev/shm" + device_segment(daemon_pid, device)
    clients = re.compile(rf"/dev/shm{NAME_PREFIX}-{daemon_pid}-s\d+-dev{device}(-b[0-9a-f]+)?")
    vmas = []
    with open(f"/proc/{daemon_pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6:
                continue
            path = fields[5].strip().removesuffix(" (deleted)")
            if path == own or clients.fullmatch(path):
                start, end = (int(value, 16) for value in fields[0].split("-"))
                vmas.append((start, end, int(fields[2], 16), path))
    bases = collections.Counter(start - pgoff for start, _, pgoff, path in vmas if path == own)
    base = bases.most_common(1)[0][0]
    for start, end, pgoff, path in vmas:
        if start <= base + offset < end and start - pgoff == base:
            return path.removeprefix("/dev/shm")
    raise ValueError(f"device {device}'s offset {offset:#x} is not mapped by the daemon")


def peek(daemon_pid: int, address: int, nbytes: int) -> bytes:
    """The `nbytes` bytes of device memory at device address `address` of the daemon
    `daemon_pid`, as they are now (one block: the pages of one file)."""
    device, offset = split_device_address(address)
    memory = posix_ipc.SharedMemory(backing_file(daemon_pid, device, offset), read_only=True)
    try:
        if offset + nbytes > memory.size:
            raise ValueError(
                f"{nbytes} bytes at {address:#x} run past device {device}'s {memory.size} bytes"
            )
        with mmap.mmap(memory.fd, memory.size, mmap.MAP_SHARED, mmap.PROT_READ) as view:
            return view[offset : offset + nbytes]
    finally:
        memory.close_fd()
