"""Registered host memory: pinned memory reachable by kernels through a device pointer
(aclrtHostRegister(V2), aclrtHostUnregister, aclrtMemAllocManaged;
server/memory/registered_memory.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.functions import Pinned

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


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
