"""A kernel process: a client's own kernels, in a process of that client alone, which maps
only that client's device memory (docs/kernel-isolation.md).

Forked by the kernel zygote (server/units/zygote_main.py) for one (client, AI core): it
maps exactly the pages of its client's grant (its blocks, its IPC imports), from the files
that hold them and nobody else's memory, into one window per device whose other pages stay
PROT_NONE, closes every descriptor but its socket to the
daemon, enters the sandbox (server/units/sandbox.py), then runs batches like a worker
(server/units/runner.py). Untrusted once it has run a kernel: it reports in JSON
(server/units/report_codec.py), which the daemon checks.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from simnpu.server.units import sandbox
from simnpu.server.units.float_overflow import watch_numpy
from simnpu.server.units.report_codec import encode_accesses, encode_results
from simnpu.server.units.runner import WorkRunner, serve_batches
from simnpu.shm import window
from simnpu.shm.addresses import DEVICE_SPAN
from simnpu.shm.notify import NotifyArea
from simnpu.shm.region import Region

if TYPE_CHECKING:
    from simnpu.server.core.unit_protocol import Mapping

KERNEL_MEMORY = 2 << 30
"""What a kernel process may map beyond its windows and what it had at start (RLIMIT_AS)."""


def map_windows(devices: int, mappings: Iterable[Mapping]) -> list[Any]:
    """One window per device (simnpu.shm.window), PROT_NONE but for the mappings (device,
    device offset, length, source offset, source segment): a buffer per device that
    kernels' views index like the device's address span. A segment gone meanwhile (an
    unregistered host range, the memory of a client that ended) stays PROT_NONE: touching
    it faults."""
    bases = [window.reserve() for _ in range(devices)]
    for device, offset, length, file_offset, source in mappings:
        window.map_segment(bases[device], source, [(offset, length, file_offset)])
    return [(ctypes.c_char * DEVICE_SPAN).from_address(base) for base in bases]


def main(
    sock: int,
    core_id: int,
    devices: int,
    mappings: tuple[Mapping, ...],
    notify: str | None,
    readable: tuple[str, ...],
    scratch: str,
) -> None:
    """A forked kernel process, from its mapping to its end: run batches for `core_id`
    from the daemon on socket `sock` with its client's memory of `devices` devices mapped
    as `mappings` say (server/core/unit_protocol.py's Grant), write the completion signals
    of the notify area `notify`, read only `readable`, write only in `scratch`."""
    maps = map_windows(devices, mappings)
    area = NotifyArea(Region.attach(notify).map) if notify else None
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never into the daemon's log (a kernel module's print is device
        # printf: its output travels in the results, server/units/device_printf.py)
        os.dup2(null, fd)
    os.closerange(3, sock)
    os.closerange(sock + 1, os.sysconf("SC_OPEN_MAX"))
    with open("/proc/self/statm") as statm:
        in_use = int(statm.read().split()[0]) * mmap.PAGESIZE
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
    serve_batches(conn, runner, encode_results, conn.send_bytes, lambda: None)
