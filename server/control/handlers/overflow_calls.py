"""Float overflow: the saturation mode of a session's new streams, and its contexts'
overflow status, read and reset in stream order (server/core/tasks/overflow.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import invalid
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.tasks import OverflowResetTask, OverflowStatusTask
from simnpu.server.core.tasks.overflow import OUTPUT_SIZE

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.GetOverflowStatusRequest)
def get_overflow_status(
    session: Session, request: pb.GetOverflowStatusRequest, reply_to: int
) -> None:
    """aclrtGetOverflowStatus (async): 107000 if the 64 bytes are not in one allocation of
    this client."""
    stream = session.stream(request.stream)
    session.memory.device_range(request.address, OUTPUT_SIZE)
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


@handles(pb.SetDeviceSatModeRequest)
def set_device_sat_mode(
    session: Session, request: pb.SetDeviceSatModeRequest, reply_to: int
) -> None:
    """aclrtSetDeviceSatMode: the streams the session creates from now on compute in `mode`
    (those it created before keep theirs, as the runtime's do); 107000 outside [0, 2)."""
    modes = (codes.ACL_RT_OVERFLOW_MODE_SATURATION, codes.ACL_RT_OVERFLOW_MODE_INFNAN)
    if request.mode not in modes:
        raise invalid(f"float overflow mode {request.mode}: use 0 (saturation) or 1 (Inf/NaN)")
    session.owner.saturation = request.mode == codes.ACL_RT_OVERFLOW_MODE_SATURATION
