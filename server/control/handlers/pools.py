"""Stream-ordered pools (aclrtMemPoolCreate / MallocAsync / FreeAsync;
server/memory/mem_pools.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, NpuMemoryError, invalid
from simnpu.server.control.handlers.registry import handles
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.waiters import Waiter
from simnpu.server.memory.mem_pools import SETTABLE, MemPool

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


def _pool(session: Session, handle: int) -> MemPool:
    return session.handles.get(handle, MemPool, "memory pool")


def _release(session: Session, pool: MemPool, address: int) -> None:
    """A pool block goes back to the device (once; the pool or the session may have gone first)."""
    memory = session.memory
    reserved = pool.blocks.pop(address, None)
    memory.pool_blocks.pop(address, None)
    if reserved is None or memory.allocations.pop(address, None) is None:
        return
    pool.used -= reserved
    session.daemon.devices[pool.device].free(address)


@handles(pb.MemPoolCreateRequest)
def create(
    session: Session, request: pb.MemPoolCreateRequest, reply_to: int
) -> pb.MemPoolCreateReply:
    device = session.device(request.device)
    if request.max_size < 0:
        raise invalid(f"a pool's maxSize cannot be negative ({request.max_size})")
    pool = MemPool(device.index, request.max_size)
    pool.handle = session.handles.add(pool, HandleKind.MEM_POOL)
    session.memory.pools.add(pool)
    return pb.MemPoolCreateReply(pool=pool.handle)


@handles(pb.MemPoolDestroyRequest)
def destroy(session: Session, request: pb.MemPoolDestroyRequest, reply_to: int) -> None:
    """Blocks still allocated from the pool are freed now."""
    pool = _pool(session, request.pool)
    session.handles.remove(pool.handle)
    session.memory.pools.discard(pool)
    for address in list(pool.blocks):
        _release(session, pool, address)


@handles(pb.MemPoolMallocRequest)
def malloc_async(
    session: Session, request: pb.MemPoolMallocRequest, reply_to: int
) -> pb.MemPoolMallocReply:
    """aclrtMemPoolMallocAsync: carved at once (new memory has no pending users)."""
    pool = _pool(session, request.pool)
    size = request.size
    session.stream(request.stream)  # must be a stream of this session
    if size <= 0:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes")
    memory = session.memory
    device = session.daemon.devices[pool.device]
    address = memory.allocate(device, size, codes.ACL_MEM_MALLOC_HUGE_FIRST)
    block = device.lookup(address)
    assert block is not None, "allocated just now"
    reserved = block.reserved
    if pool.max_size and pool.used + reserved > pool.max_size:
        del memory.allocations[address]
        device.free(address)
        raise NpuMemoryError(
            f"memory pool {pool.handle:#x} is full: asked {size} bytes "
            f"({reserved} reserved), {pool.used} of its maxSize {pool.max_size} in use"
        )
    pool.blocks[address] = reserved
    pool.used += reserved
    pool.used_high = max(pool.used_high, pool.used)
    memory.pool_blocks[address] = pool
    return pb.MemPoolMallocReply(address=address)


@handles(pb.MemPoolFreeRequest)
def free_async(session: Session, request: pb.MemPoolFreeRequest, reply_to: int) -> None:
    """aclrtMemPoolFreeAsync: the block goes back when the stream reaches this point."""
    address = request.address
    stream = session.stream(request.stream)
    pool = session.memory.pool_blocks.pop(address, None)
    if pool is None:
        raise invalid(
            f"{address:#x} was not allocated by aclrtMemPoolMallocAsync in this process "
            "(or was freed already)"
        )

    def begin() -> None:  # under the scheduler: after everything queued on the stream so far
        if not stream.tasks:
            _release(session, pool, address)
            return
        last = stream.tasks[-1].seq
        session.scheduler.watch(
            Waiter(
                lambda: stream.drained_upto(last),
                lambda timed_out: _release(session, pool, address),
            ),
            streams=[stream],
        )

    session.post(begin)


@handles(pb.MemPoolGetAttrRequest)
def get_attr(
    session: Session, request: pb.MemPoolGetAttrRequest, reply_to: int
) -> pb.MemPoolGetAttrReply:
    pool, attr = _pool(session, request.pool), request.attr
    read_only = pool.read_only()
    if attr in read_only:
        return pb.MemPoolGetAttrReply(value=read_only[attr])
    if attr in SETTABLE:
        return pb.MemPoolGetAttrReply(value=getattr(pool, SETTABLE[attr]))
    raise invalid(f"unknown memory pool attribute {attr}")


@handles(pb.MemPoolSetAttrRequest)
def set_attr(
    session: Session, request: pb.MemPoolSetAttrRequest, reply_to: int
) -> pb.MemPoolSetAttrReply:
    """The release threshold and reuse flags (stored: simnpu's pools do not cache), or a
    high-water attribute reset to 0."""
    pool, attr, value = _pool(session, request.pool), request.attr, request.value
    if attr in (
        codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH,
        codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH,
    ):
        if value != 0:
            raise invalid("a high-water attribute can only be reset to 0")
        pool.used_high = pool.used
        return pb.MemPoolSetAttrReply(value=pool.used_high)
    if attr not in SETTABLE or value < 0:
        raise invalid(f"memory pool attribute {attr} cannot be set to {value}")
    setattr(pool, SETTABLE[attr], value)
    return pb.MemPoolSetAttrReply(value=value)


@handles(pb.MemPoolTrimToRequest)
def trim_to(session: Session, request: pb.MemPoolTrimToRequest, reply_to: int) -> None:
    """aclrtMemPoolTrimTo: release unused reserved memory beyond `min_bytes_to_keep`. A
    simnpu pool holds no unused memory (a freed block goes back to the device), so there
    is never anything to release."""
    _pool(session, request.pool)
    if request.min_bytes_to_keep < 0:
        raise invalid(f"minBytesToKeep cannot be negative ({request.min_bytes_to_keep})")
