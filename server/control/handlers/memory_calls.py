"""Device memory: malloc and free under the client's limit, memory information, statistics
and snapshot, limits (server/memory/client_memory.py, quotas.py, memory_views.py); pinned
host memory (aclrtMallocHost), and registered host memory: pinned memory reachable by kernels
through a device pointer (aclrtHostRegister(V2), aclrtHostUnregister, aclrtMemAllocManaged;
server/memory/registered_memory.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, NpuMemoryError
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.memory.memory_views import memory_snapshot, memory_stats
from simnpu.server.memory.pinned_memory import Pinned
from simnpu.shm.region import Region, segment_name, shm_available_bytes

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.MallocRequest)
def malloc(session: Session, request: pb.MallocRequest, reply_to: int) -> pb.MallocReply:
    device = session.device(request.device)
    address = session.memory.allocate(device, request.size, request.policy)
    for subscriber in session.scheduler.subscribers:  # checking: it and its call site
        subscriber.allocated(session.owner, session.seq, device.index, address, request.size)
    return pb.MallocReply(address=address)


@handles(pb.FreeRequest)
def free(session: Session, request: pb.FreeRequest, reply_to: int) -> None:
    """aclrtFree. The client checks the pointer first and does not wait for this reply."""
    memory, address = session.memory, request.address
    if address in memory.allocations and address not in memory.pool_blocks:
        for subscriber in session.scheduler.subscribers:  # checking: tombstone, freed in use
            subscriber.freeing(session, address)
    memory.free(address)


@handles(pb.GetMemInfoRequest)
def get_mem_info(
    session: Session, request: pb.GetMemInfoRequest, reply_to: int
) -> pb.GetMemInfoReply:
    free_bytes, total = session.memory.mem_info(session.device(request.device))
    return pb.GetMemInfoReply(free=free_bytes, total=total)


@handles(pb.MemoryStatsRequest)
def stats(session: Session, request: pb.MemoryStatsRequest, reply_to: int) -> pb.MemoryStatsReply:
    return pb.MemoryStatsReply(
        json=json.dumps(memory_stats(session.daemon, session.device(request.device)))
    )


@handles(pb.MemorySnapshotRequest)
def snapshot(
    session: Session, request: pb.MemorySnapshotRequest, reply_to: int
) -> pb.MemorySnapshotReply:
    return pb.MemorySnapshotReply(
        json=json.dumps(
            memory_snapshot(
                session.daemon, session.device(request.device), session.tenant, session.owner
            )
        )
    )


@handles(pb.MemoryLimitRequest)
def memory_limit(
    session: Session, request: pb.MemoryLimitRequest, reply_to: int
) -> pb.MemoryLimitReply:
    """Set (limit given: > 0 lowers, 0 restores the daemon's default) or only ask; the reply
    describes the device given (device 0 when none: every device)."""
    every = not request.HasField("device")
    device = session.device(0 if every else request.device)
    limits = session.memory.limits
    if request.HasField("limit"):
        limits.set(None if every else device.index, request.limit)
    return pb.MemoryLimitReply(
        limit=limits.of(device.index) or 0,
        used=device.used_by(session.owner),
        default=limits.default or 0,
    )


@handles(pb.MallocHostRequest)
def malloc_host(
    session: Session, request: pb.MallocHostRequest, reply_to: int
) -> pb.MallocHostReply:
    """aclrtMallocHost: a segment the client maps (its host pointer) and the engines read."""
    size = request.size
    if size <= 0:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes of host memory"
        )
    available = shm_available_bytes()
    if size > available:
        raise NpuMemoryError(
            f"cannot allocate {size} bytes of pinned host memory: "
            f"/dev/shm has {available} bytes free"
        )
    try:
        region = Region.create(
            segment_name(f"s{session.id}", f"pin{session.handles.unique()}"), size
        )
    except (OSError, ValueError, OverflowError) as error:
        raise NpuMemoryError(
            f"cannot allocate {size} bytes of pinned host memory: {error}"
        ) from None
    handle = session.handles.add(Pinned(region), HandleKind.PINNED)
    return pb.MallocHostReply(segment=handle, size=size, name=region.name)


@handles(pb.FreeHostRequest)
def free_host(session: Session, request: pb.FreeHostRequest, reply_to: int) -> None:
    pinned = session.handles.get(request.segment, Pinned, "pinned host memory")
    registered = session.memory.registered
    for registration in registered.of_segment(pinned):  # they go with their memory
        registered.unregister(registration.address)
    session.handles.remove(request.segment)
    session.release_segment(pinned.region)


@handles(pb.HostRegisterRequest)
def host_register(
    session: Session, request: pb.HostRegisterRequest, reply_to: int
) -> pb.HostRegisterReply:
    pinned = session.handles.get(request.segment, Pinned, "pinned host memory")
    device = session.device(request.device)
    registration = session.memory.registered.register(
        device, pinned, request.offset, request.size, request.host, request.managed
    )
    return pb.HostRegisterReply(address=registration.address)


@handles(pb.HostUnregisterRequest)
def host_unregister(session: Session, request: pb.HostUnregisterRequest, reply_to: int) -> None:
    session.memory.registered.unregister(request.address)
