"""What `simnpu smi` shows of a device and of a client process (the Query RPC's default view).

The tool (client/tools/smi.py) turns this into the `npu-smi info` table. Utilisation is given
two ways: since the daemon started, and as cumulative busy nanoseconds with the time of
the answer, so that a tool sampling twice gets the utilisation over its own interval.
"""

from __future__ import annotations

import time

from simnpu.server.core.executor import UnitKind
from simnpu.server.graphs.capture import Graph

CHIP_NAME = "simnpu"


def device(daemon, d) -> dict:
    scheduler = daemon.scheduler
    workers = d.all_units()
    cores, engines = d.units[UnitKind.AI_CORE], d.units[UnitKind.COPY_ENGINE]
    restarting = sum(1 for w in workers if not w.ready and w.restarts)  # (not: starting)
    restarts = sum(w.restarts for w in workers)
    health = "Alarm" if restarting else ("Warning" if restarts else "OK")
    return {
        "index": d.index,
        "name": CHIP_NAME,
        "health": health,
        "bus_id": f"0000:{d.index:02X}:00.0",
        "memory_total": d.capacity,
        "memory_free": d.allocator.free_bytes,
        "memory_used": d.capacity - d.allocator.free_bytes,
        "ai_cores": len(cores),
        "copy_engines": len(engines),
        "ai_core_utilisation": scheduler.utilisation(d) if scheduler else 0.0,
        "ai_core_busy_ns": sum(w.busy_ns for w in cores),
        "ai_cores_running": sum(1 for w in cores if w.inflight),
        "copy_engines_running": sum(1 for w in engines if w.inflight),
        "now_ns": time.monotonic_ns(),
        "worker_restarts": restarts,
    }


def process(session) -> dict:
    """A client: its memory, streams and live graphs (model run instances) in all, and per
    device."""
    per_device: dict = {}

    def entry(index: int) -> dict:
        return per_device.setdefault(str(index), {"memory": 0, "streams": 0, "graphs": 0})

    for address, index in list(session.memory.allocations.items()):
        allocation = session.daemon.devices[index].lookup(address)
        if allocation is not None:
            entry(index)["memory"] += allocation.reserved
    for context in list(session.contexts):
        entry(context.device)["streams"] += len(context.streams)
    for _, thing in session.handles.items():
        if isinstance(thing, Graph):
            entry(thing.context.device)["graphs"] += 1
    return {
        "session": session.id,
        "pid": session.pid,
        "name": session.process_name,
        "tenant": str(session.tenant),
        "memory": sum(e["memory"] for e in per_device.values()),
        "streams": sum(e["streams"] for e in per_device.values()),
        "graphs": sum(e["graphs"] for e in per_device.values()),
        "devices": per_device,
    }
