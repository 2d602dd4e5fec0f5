"""Observation: a client turns tracing and checking on for its session, and fetches its
timeline and findings once its queued work has run (server/observation/observer.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto import observe as bits
from simnpu.proto.errors import NpuError
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.core.waiters import Waiter
from simnpu.server.observation.findings import Findings
from simnpu.server.observation.observer import Observer

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.server.control.session import Session

DRAIN_WAIT_S = 5.0  # how long a trace/report request waits for the session's queued work


@handles(pb.ObserveRequest)
def observe(session: Session, request: pb.ObserveRequest, reply_to: int) -> pb.ObserveReply:
    if request.flags & ~(bits.TRACE | bits.CHECKS | bits.STRICT):
        raise NpuError(
            codes.ACL_ERROR_RT_PARAM_INVALID, f"unknown observe flags {request.flags:#x}"
        )
    observer = session.daemon.observe()
    return pb.ObserveReply(flags=observer.watch(session.owner, request.flags).flags)


def _after_drain(
    session: Session, reply_to: int, answer: Callable[[Observer | None], Message]
) -> None:
    """Answer with `answer(observer)` once the session's queued work has run (or a while)."""
    observer = session.daemon.observer
    if observer is None:
        session.respond(reply_to, answer(None))
        return
    streams = session.streams()

    def begin() -> None:
        waiter = Waiter(
            lambda: all(not s.tasks for s in streams),
            lambda timed_out: session.respond(reply_to, answer(observer)),
            time.monotonic() + DRAIN_WAIT_S,
        )
        session.scheduler.watch(waiter, streams=streams)

    session.post(begin)


@handles(pb.ObserveTraceRequest)
def trace(session: Session, request: pb.ObserveTraceRequest, reply_to: int) -> object:
    def answer(observer: Observer | None) -> pb.ObserveTraceReply:
        document = observer.trace_json(session.owner) if observer else {"traceEvents": []}
        return pb.ObserveTraceReply(json=json.dumps(document, separators=(",", ":")))

    _after_drain(session, reply_to, answer)
    return LATER


@handles(pb.ObserveReportRequest)
def report(session: Session, request: pb.ObserveReportRequest, reply_to: int) -> object:
    def answer(observer: Observer | None) -> pb.ObserveReportReply:
        document = (
            observer.report_json(session.owner, request.final)
            if observer
            else Findings().as_json("off")
        )
        return pb.ObserveReportReply(json=json.dumps(document))

    _after_drain(session, reply_to, answer)
    return LATER
