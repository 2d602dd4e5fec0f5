"""Overflow status: read and reset a context's float overflow status in stream order
(server/tasks/overflow.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.handlers.registry import handles
from simnpu.server.overflow import OUTPUT_SIZE
from simnpu.server.tasks import OverflowResetTask, OverflowStatusTask

if TYPE_CHECKING:
    from simnpu.server.session import Session


@handles(pb.GetOverflowStatusRequest)
def get_overflow_status(
    session: Session, request: pb.GetOverflowStatusRequest, reply_to: int
) -> None:
    """aclrtGetOverflowStatus (async): 107000 if the 64 bytes are not in one allocation of
    this client."""
    stream = session.stream(request.stream)
    session.device_range(request.address, OUTPUT_SIZE)
    session.submit(
        OverflowStatusTask(
            session.seq, stream, session.memory, session.daemon.devices, request.address
        )
    )


@handles(pb.ResetOverflowStatusRequest)
def reset_overflow_status(
    session: Session, request: pb.ResetOverflowStatusRequest, reply_to: int
) -> None:
    """aclrtResetOverflowStatus (async)."""
    session.submit(OverflowResetTask(session.seq, session.stream(request.stream)))
