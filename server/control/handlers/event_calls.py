"""Events: create, destroy, query, synchronize, elapsed time and timestamps
(server/core/event_queries.py), the record / reset / wait commands that queue their tasks
(server/core/tasks/event.py), and IPC events: export an event's handle, open another
client's (server/core/ipc_events.py; record, wait, synchronize, query and destroy of an opened
event are the handlers here, as for the client's own)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.synchronize import deadline, unreported_failure
from simnpu.server.core import event_queries
from simnpu.server.core.ipc_events import OpenedEvent, not_for_ipc
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
    session.daemon.limits.add_event(session.contexts, context.device)
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
        session.daemon.limits.events_gone(event.context.device)
        event.context.events -= 1
        session.daemon.ipc_events.withdraw(event)


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
        done = event_queries.complete(event)
        if done and record is not None:
            for subscriber in session.scheduler.subscribers:
                subscriber.host_synced(session.owner, record=record)
        status = (
            codes.ACL_EVENT_RECORDED_STATUS_COMPLETE
            if done
            else codes.ACL_EVENT_RECORDED_STATUS_NOT_READY
        )
        hidden = unreported_failure(session.owner, record) if done else None
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
                hidden = unreported_failure(session.owner, record)
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
    """aclrtEventElapsedTime (server/core/event_queries.py); 207000 for IPC events."""
    start, end = session.event(request.start), session.event(request.end)
    if codes.ACL_EVENT_IPC in (start.flags, end.flags):
        raise not_for_ipc("aclrtEventElapsedTime")
    return session.answer_in_order(
        reply_to,
        lambda: pb.EventElapsedTimeReply(nanoseconds=event_queries.elapsed_ns(start, end)),
    )


@handles(pb.EventTimestampRequest)
def event_timestamp(session: Session, request: pb.EventTimestampRequest, reply_to: int) -> object:
    """aclrtEventGetTimestamp: microseconds of the latest record's run
    (server/core/event_queries.py); 207000 for an IPC event."""
    event = session.event(request.event)
    if event.flags == codes.ACL_EVENT_IPC:
        raise not_for_ipc("aclrtEventGetTimestamp")
    return session.answer_in_order(
        reply_to,
        lambda: pb.EventTimestampReply(microseconds=event_queries.timestamp_us(event)),
    )


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


# ---- IPC events ---------------------------------------------------------------------------------
@handles(pb.IpcGetEventHandleRequest)
def get_event_handle(
    session: Session, request: pb.IpcGetEventHandleRequest, reply_to: int
) -> pb.IpcGetEventHandleReply:
    """aclrtIpcGetEventHandle: 107000 for an event not created with ACL_EVENT_IPC alone."""
    event = session.event(request.event)
    opened = request.event != event.handle
    return pb.IpcGetEventHandleReply(handle=session.daemon.ipc_events.export(event, opened))


@handles(pb.IpcOpenEventHandleRequest)
def open_event_handle(
    session: Session, request: pb.IpcOpenEventHandleRequest, reply_to: int
) -> pb.IpcOpenEventHandleReply:
    """aclrtIpcOpenEventHandle: the exported event, in this client's context."""
    context = session.context(request.context)
    event = session.daemon.ipc_events.open(request.handle)
    handle = session.handles.add(OpenedEvent(event, context), HandleKind.IPC_EVENT)
    return pb.IpcOpenEventHandleReply(event=handle)
