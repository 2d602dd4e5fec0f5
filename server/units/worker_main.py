"""A worker process: one AI core or copy engine of a device, trusted (it runs no user code).

Spawned by the daemon's ProcessExecutor (server/units/process_executor.py) at
`simnpu.server.units.worker_main:main`: it ignores the signals of the daemon's group, ends
with the daemon, maps every device segment (each page run from the file that backs it,
as the daemon says before a batch), says Ready and runs batches
(server/units/runner.py) until the daemon stops it or is gone -- cleaning up after a daemon
that died without stopping it (its shared-memory segments).
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

from simnpu.server.core.unit_protocol import MapBacking, MapWindows, Ready, pack_results
from simnpu.server.units import gc_tuning
from simnpu.server.units.daemon_child import end_with_daemon, ignore_group_signals
from simnpu.server.units.float_overflow import watch_numpy
from simnpu.server.units.runner import WorkRunner, serve_batches
from simnpu.shm import window
from simnpu.shm.region import Region, unlink_daemon_segments


def main(core_id: int, device_segments: list[str], conn: Connection) -> None:
    """Entry point of a spawned worker process."""
    ignore_group_signals()  # (blocked since its birth)
    daemon_pid = end_with_daemon()
    regions = [  # pages are committed by the daemon at allocation (docs/device-memory.md)
        Region.attach(name, device=True) for name in device_segments
    ]

    by_name = dict(zip(device_segments, regions))

    def remap(item: MapWindows | MapBacking) -> None:
        """Map the device windows' page runs from the files the daemon names (MapBacking),
        or their reserved halves as its window table says (MapWindows)."""
        if isinstance(item, MapBacking):
            for segment, offset, length, source in item.changes:
                window.map_source(by_name[segment].address(), source, offset, length, offset)
            return
        for index, region in enumerate(regions):
            region.map_reserved({(o, n, f, s) for d, o, n, f, s in item.windows if d == index})

    def daemon_died() -> None:  # without stopping us (SIGKILL): clean up after it
        unlink_daemon_segments(daemon_pid)

    runner = WorkRunner(
        core_id, [region.map for region in regions], device_segments, conn.send, remap
    )
    watch_numpy(runner.overflow)  # the built-in kernels raise the flag on float overflow
    gc_tuning.settle()
    conn.send(Ready())
    try:
        serve_batches(conn, runner, pack_results, conn.send, daemon_died)
    except BrokenPipeError:  # the daemon closed this worker's pipe: it stops or replaced it
        if os.getppid() != daemon_pid:  # ...or it died: clean up after it
            unlink_daemon_segments(daemon_pid)
