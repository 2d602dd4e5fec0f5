"""Device queries and resource limits: aclrtGetDeviceInfo, aclrtGetDeviceUtilizationRate,
aclrtQueryDeviceStatus, aclrtGet/Set/ResetDeviceResLimit.

A simulated AI core runs cube and vector work alike, so the cube-core and the vector-core
limits of a session both bound the AI cores its kernels run on: the scheduler hands its
work only to the first `min(cube, vector)` cores of the device (server/core/scheduler.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.executor import UnitKind

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.owner import Owner

LIMIT_TYPES = (codes.ACL_RT_DEV_RES_CUBE_CORE, codes.ACL_RT_DEV_RES_VECTOR_CORE)


def _limits(owner: Owner, device: int, cores: int) -> tuple[int, int]:
    """(cube, vector) limits of `owner` on `device`; every core when none is set."""
    limits = owner.res_limits.get(device, {})
    return tuple(limits.get(kind, cores) for kind in LIMIT_TYPES)  # type: ignore[return-value]


@handles(pb.DeviceQueryRequest)
def query(session: Session, request: pb.DeviceQueryRequest, reply_to: int) -> pb.DeviceQueryReply:
    device = session.device(request.device)
    cores = len(device.units[UnitKind.AI_CORE])
    scheduler = session.daemon.scheduler
    assert scheduler is not None, "sessions open once the daemon runs"
    with scheduler.lock:
        cube, vector = _limits(session.owner, device.index, cores)
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
    cores = len(device.units[UnitKind.AI_CORE])
    if not request.reset:
        if request.type not in LIMIT_TYPES:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"resource type {request.type}: use ACL_RT_DEV_RES_CUBE_CORE (0) or "
                "ACL_RT_DEV_RES_VECTOR_CORE (1)",
            )
        if not 1 <= request.value <= cores:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"limit {request.value}: device {device.index} has {cores} AI cores "
                f"(a limit is 1 .. {cores})",
            )
    owner = session.owner
    scheduler = session.daemon.scheduler
    assert scheduler is not None, "sessions open once the daemon runs"
    with scheduler.lock:
        if request.reset:
            owner.res_limits.pop(device.index, None)
        else:
            owner.res_limits.setdefault(device.index, {})[request.type] = request.value
        cube, vector = _limits(owner, device.index, cores)
        if min(cube, vector) < cores:
            owner.core_limits[device.index] = min(cube, vector)
        else:
            owner.core_limits.pop(device.index, None)
    return pb.SetDeviceResLimitReply(cube_limit=cube, vector_limit=vector)
