"""What the waits of a session's calls share: the deadline of a call with a timeout, the wait
for a client's streams (aclrtSynchronizeStream / Device) and for streams that are destroyed,
and what a synchronize reports -- a rejected call, a stopped context's failure or a stream's
(`take_failure`), the failure an event's success hides (`unreported_failure`), and running
something once a stream has reached the point of a call (`when_reached`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import invalid
from simnpu.server.core.waiters import Waiter

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Failure, Stream
    from simnpu.server.core.tasks import RecordTask


def deadline(timeout_ms: int) -> float | None:
    """The monotonic time a wait of `timeout_ms` ends (-1: never)."""
    if timeout_ms < -1:
        raise invalid(f"timeout {timeout_ms} ms: use -1 (wait forever), 0 or a positive number")
    return None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000.0


def take_failure(owner: Owner, streams: list[Stream]) -> Failure | None:
    """What a synchronize of `streams` of `owner` reports (under the scheduler lock): a
    rejected call, else a stopped context's failure, else a stream's (each reported once)."""
    if owner.rejected is not None:
        failure, owner.rejected = owner.rejected, None
        return failure
    for stream in streams:
        if stream.context.failure is not None:
            return stream.context.failure
    for stream in streams:
        if stream.failure is not None:
            failure, stream.failure = stream.failure, None
            return failure
    return None


def unreported_failure(owner: Owner, record: RecordTask | None) -> pb.UnreportedFailure | None:
    """What an event's success hides (CANN's Context::CheckStatus reports nothing in
    ACL_CONTINUE_ON_FAILURE): the first unreported failure of the record's stream, or a
    rejected call, submitted before the record. Each is sent once; the stream's synchronize
    still reports it. Under the scheduler lock."""
    if record is None or record.stream.owner is not owner:  # (another's IPC event)
        return None
    for failure, stream in ((record.stream.failure, record.stream.handle), (owner.rejected, 0)):
        if failure is not None and failure.seq < record.seq and not failure.told:
            failure.told = True
            return pb.UnreportedFailure(
                task_seq=failure.seq, code=failure.code, message=failure.message, stream=stream
            )
    return None


def wait_streams(
    session: Session, reply_to: int, streams: list[Stream], until: float | None
) -> None:
    """Answer `reply_to` when `streams` have run all they had when this runs (under the
    scheduler), with the failure a synchronize reports (507046 at the deadline) and the
    client's device output."""
    targets = [(s, s.tasks[-1].seq) for s in streams if s.tasks]
    for subscriber in session.scheduler.subscribers:  # the host will have seen these finish
        subscriber.host_synced(session.owner, streams)

    def finish(timed_out: bool) -> None:
        output = session.owner.output.take()  # what kernels printed (server/units/device_printf.py)
        if timed_out:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                message="synchronize timed out",
                device_output=output,
            )
        else:
            session.respond_failure(reply_to, take_failure(session.owner, streams), output)

    waiter = Waiter(lambda: all(s.drained_upto(seq) for s, seq in targets), finish, until)
    session.scheduler.watch(waiter, streams=[s for s, _ in targets])


def when_drained(
    session: Session, streams: list[Stream], drop: bool, then: Callable[[], None]
) -> None:
    """Under the scheduler: `then()` once `streams` have no task left (aclrtDestroyStream,
    aclrtDestroyContext) -- with `drop`, their queued tasks are dropped first; without, the
    host waits for them."""
    scheduler = session.scheduler
    if drop:
        for stream in streams:
            scheduler.drop_pending(stream)
    else:
        for subscriber in scheduler.subscribers:  # the host waits for their tasks
            subscriber.host_synced(session.owner, streams)
    waiter = Waiter(lambda: all(not s.tasks for s in streams), lambda timed_out: then())
    scheduler.watch(waiter, streams=streams)


def when_reached(scheduler: Scheduler, stream: Stream, then: Callable[[], None]) -> None:
    """Under the scheduler: `then()` once `stream` has run every task queued on it so far
    (at once if none is: aclrtMemPoolFreeAsync)."""
    if not stream.tasks:
        then()
        return
    last = stream.tasks[-1].seq
    scheduler.watch(
        Waiter(lambda: stream.drained_upto(last), lambda timed_out: then()), streams=[stream]
    )
