"""Device queries and a process's AI-core limits: aclrtGetDeviceInfo,
aclrtGetDeviceUtilizationRate, aclrtQueryDeviceStatus, aclrtGet/Set/ResetDeviceResLimit
(server/control/core_limits.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.server.control import core_limits
from simnpu.server.control.handlers.registry import handles

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.DeviceQueryRequest)
def query(session: Session, request: pb.DeviceQueryRequest, reply_to: int) -> pb.DeviceQueryReply:
    device = session.device(request.device)
    cores = core_limits.ai_cores(device)
    scheduler = session.scheduler
    cube, vector = core_limits.process_limits(scheduler, session.owner, device.index, cores)
    return pb.DeviceQueryReply(
        ai_cores=cores,
        total_memory=device.capacity,
        utilization=round(100 * scheduler.utilisation(device)),
        status=codes.ACL_RT_DEVICE_STATUS_NORMAL,
        cube_limit=cube,
        vector_limit=vector,
    )


@handles(pb.SetDeviceResLimitRequest)
def set_limit(
    session: Session, request: pb.SetDeviceResLimitRequest, reply_to: int
) -> pb.SetDeviceResLimitReply:
    """aclrtSetDeviceResLimit (or, with `reset`, aclrtResetDeviceResLimit): from now on the
    session's kernels on the device run on at most that many AI cores."""
    device = session.device(request.device)
    cube, vector = core_limits.set_process_limit(
        session.scheduler,
        session.owner,
        device.index,
        core_limits.ai_cores(device),
        None if request.reset else request.type,
        request.value,
    )
    return pb.SetDeviceResLimitReply(cube_limit=cube, vector_limit=vector)
