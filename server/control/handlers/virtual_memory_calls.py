"""Virtual memory management: reserved address ranges, physical allocations, mappings
(aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem...; server/memory/virtual_memory.py),
and physical memory shared between processes (server/memory/shareable_memory.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.memory.virtual_memory import Physical

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.ReserveMemAddressRequest)
def reserve(
    session: Session, request: pb.ReserveMemAddressRequest, reply_to: int
) -> pb.ReserveMemAddressReply:
    device = session.device(request.device)
    virtual = session.memory.virtual
    address = virtual.reserve(device, request.size, request.alignment, request.expect)
    return pb.ReserveMemAddressReply(address=address, size=virtual.reservations[address].size)


@handles(pb.ReleaseMemAddressRequest)
def release(session: Session, request: pb.ReleaseMemAddressRequest, reply_to: int) -> None:
    session.memory.virtual.release(request.address)


@handles(pb.MallocPhysicalRequest)
def malloc_physical(
    session: Session, request: pb.MallocPhysicalRequest, reply_to: int
) -> pb.MallocPhysicalReply:
    device = session.device(request.device)
    physical = session.memory.virtual.malloc_physical(device, request.size, request.mem_attr)
    handle = session.handles.add(physical, HandleKind.PHYSICAL)
    return pb.MallocPhysicalReply(handle=handle, size=physical.size)


@handles(pb.FreePhysicalRequest)
def free_physical(session: Session, request: pb.FreePhysicalRequest, reply_to: int) -> None:
    """aclrtFreePhysical: the handle goes with its last reference."""
    physical = session.handles.get(request.handle, Physical, "physical memory handle")
    virtual = session.memory.virtual
    if virtual.physical.get(physical, 0) <= 1:
        session.handles.remove(request.handle)
        session.daemon.shareable.let_go(session.owner, physical)  # no new imports
    virtual.free_physical(physical)


@handles(pb.MapMemRequest)
def map_mem(session: Session, request: pb.MapMemRequest, reply_to: int) -> None:
    physical = session.handles.get(request.handle, Physical, "physical memory handle")
    session.memory.virtual.map(request.address, request.size, request.offset, physical)


@handles(pb.UnmapMemRequest)
def unmap_mem(session: Session, request: pb.UnmapMemRequest, reply_to: int) -> None:
    session.memory.virtual.unmap(request.address)


@handles(pb.RetainAllocationHandleRequest)
def retain(
    session: Session, request: pb.RetainAllocationHandleRequest, reply_to: int
) -> pb.RetainAllocationHandleReply:
    """aclrtMemRetainAllocationHandle: the handle of the block mapped at the address (the
    same handle aclrtMallocPhysical gave, one more reference)."""
    physical = session.memory.virtual.retain(request.address)
    handle = session.handles.handle_of(physical) or session.handles.add(
        physical, HandleKind.PHYSICAL
    )
    return pb.RetainAllocationHandleReply(
        handle=handle, size=physical.size, device=physical.device, mem_attr=physical.mem_attr
    )


@handles(pb.ExportShareableRequest)
def export_shareable(
    session: Session, request: pb.ExportShareableRequest, reply_to: int
) -> pb.ExportShareableReply:
    """aclrtMemExportToShareableHandle(V2). Blocks until none of the client's work runs
    (its pages get a file of their own)."""
    physical = session.handles.get(request.handle, Physical, "physical memory handle")
    if physical.owner is not session.owner:
        raise invalid("imported physical memory cannot be exported again")
    shareable = session.daemon.shareable.export(session.owner, physical, request.flags)
    try:  # its pages get a file of their own (blocks while the client's work runs)
        session.memory.share(
            physical.device, physical.address, physical.size, session.scheduler.quiet
        )
    except NpuError:
        session.daemon.shareable.let_go(session.owner, physical)
        raise
    return pb.ExportShareableReply(shareable=shareable)


@handles(pb.SetShareablePidsRequest)
def set_shareable_pids(
    session: Session, request: pb.SetShareablePidsRequest, reply_to: int
) -> None:
    session.daemon.shareable.set_pids(session.owner, request.shareable, list(request.pids))


@handles(pb.ImportShareableRequest)
def import_shareable(
    session: Session, request: pb.ImportShareableRequest, reply_to: int
) -> pb.ImportShareableReply:
    """The importer's handle of the exporter's physical memory (one more reference)."""
    device = session.device(request.device)
    physical = session.daemon.shareable.import_(
        session.owner, request.shareable, session.daemon.peer_of(session).pid
    )
    session.memory.virtual.hold_import(physical, device.index, request.shareable)
    handle = session.handles.add(physical, HandleKind.PHYSICAL)
    return pb.ImportShareableReply(
        handle=handle, size=physical.size, device=physical.device, mem_attr=physical.mem_attr
    )
