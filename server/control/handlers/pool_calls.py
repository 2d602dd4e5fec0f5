"""Stream-ordered pools: aclrtMemPoolCreate / Destroy / MallocAsync / FreeAsync / GetAttr /
SetAttr / TrimTo (server/memory/mem_pools.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.control.synchronize import when_reached
from simnpu.server.memory import mem_pools
from simnpu.server.memory.mem_pools import MemPool

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


def _pool(session: Session, handle: int) -> MemPool:
    return session.handles.get(handle, MemPool, "memory pool")


@handles(pb.MemPoolCreateRequest)
def create(
    session: Session, request: pb.MemPoolCreateRequest, reply_to: int
) -> pb.MemPoolCreateReply:
    device = session.device(request.device)
    pool = mem_pools.create(session.memory, device.index, request.max_size)
    pool.handle = session.handles.add(pool, HandleKind.MEM_POOL)
    return pb.MemPoolCreateReply(pool=pool.handle)


@handles(pb.MemPoolDestroyRequest)
def destroy(session: Session, request: pb.MemPoolDestroyRequest, reply_to: int) -> None:
    """Blocks still allocated from the pool are freed now."""
    pool = _pool(session, request.pool)
    session.handles.remove(pool.handle)
    mem_pools.destroy(session.memory, pool, session.daemon.devices[pool.device])


@handles(pb.MemPoolMallocRequest)
def malloc_async(
    session: Session, request: pb.MemPoolMallocRequest, reply_to: int
) -> pb.MemPoolMallocReply:
    """aclrtMemPoolMallocAsync: carved at once (new memory has no pending users)."""
    pool = _pool(session, request.pool)
    session.stream(request.stream)  # must be a stream of this session
    device = session.daemon.devices[pool.device]
    address = mem_pools.malloc_async(session.memory, pool, device, request.size)
    return pb.MemPoolMallocReply(address=address)


@handles(pb.MemPoolFreeRequest)
def free_async(session: Session, request: pb.MemPoolFreeRequest, reply_to: int) -> None:
    """aclrtMemPoolFreeAsync: the block goes back when the stream reaches this point."""
    address = request.address
    stream = session.stream(request.stream)
    memory = session.memory
    pool = mem_pools.free_async(memory, address)
    device = session.daemon.devices[pool.device]
    session.post(
        when_reached,
        session.scheduler,
        stream,
        lambda: mem_pools.release(memory, pool, device, address),
    )


@handles(pb.MemPoolGetAttrRequest)
def get_attr(
    session: Session, request: pb.MemPoolGetAttrRequest, reply_to: int
) -> pb.MemPoolGetAttrReply:
    return pb.MemPoolGetAttrReply(value=_pool(session, request.pool).get_attr(request.attr))


@handles(pb.MemPoolSetAttrRequest)
def set_attr(
    session: Session, request: pb.MemPoolSetAttrRequest, reply_to: int
) -> pb.MemPoolSetAttrReply:
    """The release threshold and reuse flags, or a high-water attribute reset to 0."""
    pool = _pool(session, request.pool)
    return pb.MemPoolSetAttrReply(value=pool.set_attr(request.attr, request.value))


@handles(pb.MemPoolTrimToRequest)
def trim_to(session: Session, request: pb.MemPoolTrimToRequest, reply_to: int) -> None:
    """aclrtMemPoolTrimTo: never anything to release (server/memory/mem_pools.py)."""
    _pool(session, request.pool)
    mem_pools.check_trim(request.min_bytes_to_keep)
