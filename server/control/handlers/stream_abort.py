"""Ending a stream's work: aclrtStreamAbort and aclrtStreamStop (Scheduler.abort)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handlers.registry import LATER, handles

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.StreamAbortRequest)
def stream_abort(session: Session, request: pb.StreamAbortRequest, reply_to: int) -> object:
    """aclrtStreamAbort / aclrtStreamStop (`stop`): answers once the stream's running work
    has been ended (and, for an abort, its queued tasks discarded)."""
    stream = session.stream(request.stream)

    def end() -> None:
        session.scheduler.abort(stream, request.stop)
        session.respond(reply_to)

    session.post(end)
    return LATER
