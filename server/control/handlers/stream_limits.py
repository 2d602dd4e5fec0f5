"""Stream resource limits: aclrtGet/Set/ResetStreamResLimit, and the launches of a thread
that uses a stream's limits (aclrtUseStreamResInCurrentThread).

A stream's limit of a type is its own when set, else its process's on the device
(aclrtSetDeviceResLimit), else every AI core: the stream's limit wins over the process's,
even when larger. As for the device limits (server/control/handlers/devices.py), the smaller of the
cube and vector limits in force bounds the AI cores the stream's kernels run on
(`Stream.limits`, `Stream.core_limit`, which the scheduler reads). A launch of a thread
using a stream's limits comes as a ThreadLimited record: that stream's core limit bounds
it, whatever stream it runs on (`Task.limits_from`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.server.control.handlers.devices import LIMIT_TYPES
from simnpu.server.control.handlers.registry import HANDLERS, handles
from simnpu.server.core.executor import UnitKind

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.StreamResLimitRequest)
def stream_res_limit(
    session: Session, request: pb.StreamResLimitRequest, reply_to: int
) -> pb.StreamResLimitReply:
    """aclrtSetStreamResLimit (`type` set), aclrtResetStreamResLimit (`reset`) or
    aclrtGetStreamResLimit (neither): the stream's limits in force afterwards."""
    stream = session.stream(request.stream)
    cores = len(session.device(stream.device).units[UnitKind.AI_CORE])
    setting = request.HasField("type")
    if setting:
        if request.type not in LIMIT_TYPES:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"resource type {request.type}: use ACL_RT_DEV_RES_CUBE_CORE (0) or "
                "ACL_RT_DEV_RES_VECTOR_CORE (1)",
            )
        if not 1 <= request.value <= cores:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"limit {request.value}: device {stream.device} has {cores} AI cores "
                f"(a limit is 1 .. {cores})",
            )
    scheduler = session.scheduler
    with scheduler.lock:
        if request.reset:
            stream.res_limits.clear()
        elif setting:
            stream.res_limits[request.type] = request.value
        cube, vector = stream.limits(cores)
    return pb.StreamResLimitReply(cube_limit=cube, vector_limit=vector)


@handles(commands.ThreadLimited)
def thread_limited(session: Session, record: commands.ThreadLimited) -> None:
    """A launch (async) bounded by the core limit of the stream its thread uses: that stream
    is passed to the launch's handler, which queues the launch with it."""
    HANDLERS[type(record.launch)](session, record.launch, session.stream(record.limits))
