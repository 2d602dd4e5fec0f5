"""What the daemon tells about device memory: the pool statistics and the live-block snapshot.

The same views answer a client (OP_MEMORY_STATS / OP_MEMORY_SNAPSHOT) and the tools
(the Query RPC's "memory_stats" / "memory_snapshot", `simnpu memory ...`). The key schema
is documented in docs/memory.md.
"""

from __future__ import annotations

from simnpu.server.core.tenants import Tenant
from simnpu.shm.addresses import device_address


def memory_stats(daemon, device) -> dict:
    """The allocator's counters (torch.cuda.memory_stats names plus simnpu's own), the IPC
    counts and the per-client limits in force."""
    with device.lock:
        stats = device.allocator.stats()
        usage = device.allocator.usage_by_owner()
    stats.update(daemon.ipc.counts())
    stats["device"] = device.index
    stats["memory_limit.default"] = daemon.config.memory_limit or 0
    stats["num_clients_with_memory"] = len(usage)
    return stats


def memory_snapshot(daemon, device, viewer: Tenant, client: object = None) -> list[dict]:
    """Live blocks in address order, those of tenant `viewer`'s clients (the operator: all):
    where, how big, whose (session, pid, process), how they are shared (IPC keys only to
    their exporter: `client` is the asking client's Owner, None for a tool), and for
    physical memory (aclrtMallocPhysical) where it is mapped."""
    with device.lock:
        blocks = device.allocator.snapshot()
    out = []
    for block in blocks:
        owner = block.pop("owner")
        session = daemon.sessions.get(getattr(owner, "id", None))
        if not viewer.operator and (session is None or session.tenant != viewer):
            continue
        address = device_address(device.index, block["offset"])
        entry = {
            "address": address,
            **block,
            "owner": repr(owner),
            "session": getattr(owner, "id", None),
            "pid": getattr(owner, "pid", None),
        }
        shared = daemon.ipc.describe(address, client)
        if shared is not None:
            entry["ipc"] = shared
        pool = session.memory.pool_of(address) if session is not None else None
        if pool is not None:
            entry["pool"] = pool
        physical = session.memory.virtual.describe(address) if session is not None else None
        if physical is not None:
            entry["physical"] = physical
        out.append(entry)
    return out
