"""Event timestamps (aclrtEventGetTimestamp): when an event's latest record ran, on the
device clock the scheduler keeps (CLOCK_MONOTONIC: time since the host system started)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.core.ipc_events import not_for_ipc
from simnpu.server.core.tasks import TaskState

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.EventTimestampRequest)
def event_timestamp(session: Session, request: pb.EventTimestampRequest, reply_to: int) -> object:
    """aclrtEventGetTimestamp: microseconds of the latest record's run. Never recorded: the
    CANN runtime's EVENT_RECORDER_NULL (ACL_ERROR_RT_INTERNAL_ERROR, as for
    aclrtEventElapsedTime); recorded but not run yet: ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID."""
    event = session.event(request.event)
    if event.flags == codes.ACL_EVENT_IPC:
        raise not_for_ipc("aclrtEventGetTimestamp")

    def answer() -> None:
        record = event.latest_record
        if record is None:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_INTERNAL_ERROR,
                message="the event has not been recorded (event recorder null)",
            )
        elif record.state != TaskState.DONE:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID,
                message="the event's latest record has not run yet: synchronize it first",
            )
        else:
            micros = record.timestamp // 1000
            session.respond(reply_to, pb.EventTimestampReply(microseconds=micros))

    session.post(answer)
    return LATER
