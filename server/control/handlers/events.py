"""Events: create, destroy, query, synchronize, elapsed time, and the record / reset /
wait commands that queue their tasks (server/core/tasks/event.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handlers.streams import deadline
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.ipc_events import not_for_ipc
from simnpu.server.core.streams import Event
from simnpu.server.core.tasks import RecordTask, ResetTask, TaskState, WaitTask
from simnpu.server.core.waiters import Waiter

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.CreateEventRequest)
def create_event(
    session: Session, request: pb.CreateEventRequest, reply_to: int
) -> pb.CreateEventReply:
    """aclrtCreateEvent(WithFlag); 207007 past the client's or the device's limit."""
    context = session.context(request.context)
    limit = session.daemon.config.max_events_per_client
    if sum(c.events for c in session.contexts if c.device == context.device) >= limit:
        raise NpuError(
            codes.ACL_ERROR_RT_NO_EVENT_RESOURCE,
            f"this client has {limit} events on device {context.device}, the most one client "
            f"may have (simnpu serve --max-events-per-client); the device has "
            f"{codes.MAX_EVENTS_PER_DEVICE} for all of its clients",
        )
    session.daemon.count_event(context.device, +1)
    context.events += 1
    event = Event(0, context, request.flags)
    event.handle = session.handles.add(event, HandleKind.EVENT)
    return pb.CreateEventReply(event=event.handle)


@handles(pb.DestroyEventRequest)
def destroy_event(session: Session, request: pb.DestroyEventRequest, reply_to: int) -> None:
    """aclrtDestroyEvent; an opened IPC event's handle goes, the event stays its exporter's."""
    event = session.event(request.event)
    session.handles.remove(request.event)
    if request.event == event.handle:
        session.daemon.count_event(event.context.device, -1)
        event.context.events -= 1
        session.daemon.ipc_events.withdraw(event)


def unreported_failure(session: Session, record: RecordTask | None) -> pb.UnreportedFailure | None:
    """What an event's success hides (CANN's Context::CheckStatus reports nothing in
    ACL_CONTINUE_ON_FAILURE): the first unreported failure of the record's stream, or a
    rejected call, submitted before the record. Each is sent once; the stream's synchronize
    still reports it. Under the scheduler lock."""
    if record is None or record.stream.owner is not session.owner:  # (another's IPC event)
        return None
    for failure, stream in (
        (record.stream.failure, record.stream.handle),
        (session.owner.rejected, 0),
    ):
        if failure is not None and failure.seq < record.seq and not failure.told:
            failure.told = True
            return pb.UnreportedFailure(
                task_seq=failure.seq, code=failure.code, message=failure.message, stream=stream
            )
    return None


@handles(pb.QueryEventRequest)
def query_event(session: Session, request: pb.QueryEventRequest, reply_to: int) -> object:
    """aclrtQueryEventStatus: complete once the event's latest record has run; a stopped
    context's failure (ACL_STOP_ON_FAILURE) is the call's error, as in CANN's
    ApiImpl::EventQueryStatus."""
    event, context = session.event(request.event), session.event_context(request.event)

    def answer() -> None:
        if context.failure is not None:
            session.respond_failure(reply_to, context.failure)
            return
        record = event.latest_record
        if record is None:  # an IPC event never recorded is complete (IpcEvent::IpcEventQuery)
            done = event.flags == codes.ACL_EVENT_IPC
        else:
            done = record.state == TaskState.DONE
        if done and record is not None:
            for subscriber in session.scheduler.subscribers:
                subscriber.host_synced(session.owner, record=record)
        status = (
            codes.ACL_EVENT_RECORDED_STATUS_COMPLETE
            if done
            else codes.ACL_EVENT_RECORDED_STATUS_NOT_READY
        )
        hidden = unreported_failure(session, record) if done else None
        session.respond(reply_to, pb.QueryEventReply(status=status, unreported_failure=hidden))

    session.post(answer)
    return LATER


@handles(pb.SynchronizeEventRequest)
def synchronize_event(
    session: Session, request: pb.SynchronizeEventRequest, reply_to: int
) -> object:
    """aclrtSynchronizeEvent(WithTimeout): the event's latest record; 507047 at the deadline.
    It reports a stopped context's failure (ACL_STOP_ON_FAILURE) and no other, as CANN's
    ApiImpl::EventSynchronize does; a failure its success hides goes in the reply."""
    event, context = session.event(request.event), session.event_context(request.event)
    until = deadline(request.timeout_ms)
    scheduler = session.scheduler

    def begin() -> None:
        record = event.latest_record
        if record is not None:
            for subscriber in scheduler.subscribers:
                subscriber.host_synced(session.owner, record=record)

        def finish(timed_out: bool) -> None:
            if timed_out:
                session.respond(
                    reply_to,
                    code=codes.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                    message="event synchronize timed out",
                )
            elif context.failure is not None:
                session.respond_failure(reply_to, context.failure)
            else:
                hidden = unreported_failure(session, record)
                session.respond(
                    reply_to,
                    None if hidden is None else pb.SynchronizeEventReply(unreported_failure=hidden),
                )

        waiter = Waiter(lambda: record is None or record.state == TaskState.DONE, finish, until)
        scheduler.watch(waiter, tasks=[record] if record is not None else [])

    session.post(begin)
    return LATER


@handles(pb.EventElapsedTimeRequest)
def event_elapsed_time(
    session: Session, request: pb.EventElapsedTimeRequest, reply_to: int
) -> object:
    start, end = session.event(request.start), session.event(request.end)
    if codes.ACL_EVENT_IPC in (start.flags, end.flags):
        raise not_for_ipc("aclrtEventElapsedTime")

    def answer() -> None:
        first, last = start.latest_record, end.latest_record
        if (
            first is None or last is None
        ):  # CANN: EVENT_RECORDER_NULL, reported as ACL_ERROR_RT_INTERNAL_ERROR
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_INTERNAL_ERROR,
                message="both events must have been recorded (event recorder null)",
            )
        elif first.state != TaskState.DONE or last.state != TaskState.DONE:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_EVENT_NOT_COMPLETE,
                message="an event has not completed yet: synchronize it first",
            )
        elif last.timestamp < first.timestamp:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL,
                message="the end event completed before the start event",
            )
        else:
            session.respond(
                reply_to, pb.EventElapsedTimeReply(nanoseconds=last.timestamp - first.timestamp)
            )

    session.post(answer)
    return LATER


_TASKS = {
    commands.RecordEvent: RecordTask,
    commands.ResetEvent: ResetTask,
    commands.WaitEvent: WaitTask,
}


@handles(commands.RecordEvent, commands.ResetEvent, commands.WaitEvent)
def event_command(session: Session, record: commands.RecordEvent) -> None:
    """aclrtRecordEvent / aclrtResetEvent / aclrtStreamWaitEvent (async)."""
    event, stream = session.event(record.event), session.stream(record.stream)
    if type(record) is commands.ResetEvent and event.flags == codes.ACL_EVENT_IPC:
        raise not_for_ipc("aclrtResetEvent")
    session.submit(_TASKS[type(record)](session.seq, stream, event))


@handles(commands.WaitEventTimeout)
def wait_event_timeout(session: Session, record: commands.WaitEventTimeout) -> None:
    """aclrtStreamWaitEventWithTimeout with a timeout (async): the wait fails after it."""
    event, stream = session.event(record.event), session.stream(record.stream)
    session.submit(WaitTask(session.seq, stream, event, record.timeout))
