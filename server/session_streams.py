"""A session's contexts, streams and events, and the requests that wait for them
(synchronize device / stream / event, destroy, query, elapsed time).

A mixin of `Session` (server/session.py), which owns the handle table and the batch of
scheduler work these handlers append to; replies of blocking calls come from Waiters.
"""

from __future__ import annotations

import time

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.objects import Context, Event, Stream, Waiter
from simnpu.server.sentinels import DEFERRED


class SessionStreams:
    def _create_context(self, request):
        device = self._device(request.args[0])
        context = Context(0, device.index, self)
        context.handle = self._new_handle(context, 1)
        self.contexts.append(context)
        stream = self._add_stream(context, 0, 0)
        return [context.handle, stream.handle, stream.notify_slot]

    def _add_stream(self, context: Context, priority: int, flags: int) -> Stream:
        self.daemon.count_stream(context.device, +1)
        stream = Stream(0, context, priority, flags)
        stream.handle = self._new_handle(stream, 2)
        stream.notify_slot = self._take_stream_slot()
        context.streams.append(stream)
        return stream

    def _destroy_context(self, request):
        context = self._context(request.args[0])
        del self.handles[context.handle]
        self.contexts.remove(context)
        streams = list(context.streams)
        for stream in streams:
            stream.destroyed = True
            self.handles.pop(stream.handle, None)
        for handle, obj in list(self.handles.items()):
            if isinstance(obj, Event) and obj.context is context:
                self._forget_event(handle)

        def begin():
            if self.scheduler.observer is not None:  # the host waits for their tasks
                self.scheduler.observer.host_synced(self, streams)
            waiter = Waiter(lambda: all(not s.tasks for s in streams), lambda timed_out: finish())
            self.scheduler.watch(waiter, streams=streams)

        def finish():
            for stream in streams:
                self.daemon.count_stream(context.device, -1)
                self.release_stream_slot(stream)
            self.respond(request.id)

        self._batch.append((begin, ()))
        return DEFERRED

    def _timeout_deadline(self, timeout_ms: int) -> float | None:
        if timeout_ms < -1:
            raise invalid(f"timeout {timeout_ms} ms: use -1 (wait forever), 0 or a positive number")
        return None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000.0

    def _wait_streams(self, request_id: int, streams: list, deadline, timeout_code: int, failure_of) -> None:
        """Reply to `request_id` when the given streams have run all they had when this was
        called (scheduler thread), or with `timeout_code` at the deadline."""
        targets = [(s, s.tasks[-1].seq) for s in streams if s.tasks]
        if self.scheduler.observer is not None:  # the host will have seen these streams finish
            self.scheduler.observer.host_synced(self, streams)

        def finish(timed_out: bool) -> None:
            if timed_out:
                self.respond(request_id, timeout_code, "synchronize timed out")
            else:
                self.respond_failure(request_id, failure_of())

        waiter = Waiter(lambda: all(s.drained_upto(seq) for s, seq in targets), finish, deadline)
        self.scheduler.watch(waiter, streams=[s for s, _ in targets])

    def _take_failure(self, streams):
        """The failure a synchronize reports: a stopped context's, else a stream's (once)."""
        if self.submit_failure is not None:
            error, self.submit_failure = self.submit_failure, None
            return _AsFailure(error)
        for stream in streams:
            if stream.context.failure is not None:
                return stream.context.failure
        for stream in streams:
            if stream.failure is not None:
                failure, stream.failure = stream.failure, None
                return failure
        return None

    def _synchronize_device(self, request):
        device = self._device(request.args[0])
        deadline = self._timeout_deadline(request.args[1])
        streams = [s for c in self.contexts if c.device == device.index for s in c.streams]
        self._batch.append((self._wait_streams, (request.id, streams, deadline,
                                                 codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                                                 lambda: self._take_failure(streams))))
        return DEFERRED

    def _create_stream(self, request):
        context = self._context(request.args[0])
        priority = min(max(request.args[1], codes.STREAM_PRIORITY_GREATEST), codes.STREAM_PRIORITY_LEAST)
        stream = self._add_stream(context, priority, request.args[2])
        return [stream.handle, stream.notify_slot]

    def _destroy_stream(self, request):
        stream = self._stream(request.args[0])
        if stream is stream.context.streams[0]:
            raise invalid("the default stream of a context cannot be destroyed")
        force = bool(request.args[1])
        del self.handles[stream.handle]
        stream.destroyed = True

        def begin():
            if force:
                self.scheduler.drop_pending(stream)
            elif self.scheduler.observer is not None:  # the host waits for its tasks
                self.scheduler.observer.host_synced(self, [stream])
            waiter = Waiter(lambda: not stream.tasks, lambda timed_out: finish())
            self.scheduler.watch(waiter, streams=[stream])

        def finish():
            stream.context.streams.remove(stream)
            self.daemon.count_stream(stream.device, -1)
            self.release_stream_slot(stream)
            self.respond(request.id)

        self._batch.append((begin, ()))
        return DEFERRED

    def _synchronize_stream(self, request):
        stream = self._stream(request.args[0])
        deadline = self._timeout_deadline(request.args[1])
        self._batch.append((self._wait_streams, (request.id, [stream], deadline,
                                                 codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                                                 lambda: self._take_failure([stream]))))
        return DEFERRED

    def _query_stream(self, request):
        stream = self._stream(request.args[0])

        def answer():
            self.scheduler.catch_up(stream)  # the client may have seen its word already
            failure = self._take_failure([stream])
            if failure is not None:
                self.respond_failure(request.id, failure)
            else:
                status = codes.ACL_STREAM_STATUS_NOT_READY if stream.tasks else codes.ACL_STREAM_STATUS_COMPLETE
                if not stream.tasks and self.scheduler.observer is not None:
                    self.scheduler.observer.host_synced(self, [stream])
                self.respond(request.id, values=[status])

        self._batch.append((answer, ()))
        return DEFERRED

    def _set_stream_failure_mode(self, request):
        stream, mode = self._stream(request.args[0]), request.args[1]
        if mode not in (codes.ACL_CONTINUE_ON_FAILURE, codes.ACL_STOP_ON_FAILURE):
            raise invalid(f"unknown failure mode {mode}")
        context = stream.context
        if context.failure_mode == codes.ACL_STOP_ON_FAILURE and mode == codes.ACL_CONTINUE_ON_FAILURE:
            raise NpuError(codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                           "a context in ACL_STOP_ON_FAILURE cannot go back to ACL_CONTINUE_ON_FAILURE")

        def apply():
            context.failure_mode = mode
            self.respond(request.id)

        self._batch.append((apply, ()))
        return DEFERRED

    def _create_event(self, request):
        context = self._context(request.args[0])
        self.daemon.count_event(context.device, +1)
        event = Event(0, context, request.args[1])
        event.handle = self._new_handle(event, 3)
        return [event.handle]

    def _forget_event(self, handle: int) -> None:
        event = self.handles.pop(handle)
        self.daemon.count_event(event.context.device, -1)

    def _destroy_event(self, request):
        self._event(request.args[0])
        self._forget_event(request.args[0])
        return []

    def _query_event(self, request):
        event = self._event(request.args[0])

        def answer():
            record = event.latest_record
            done = record is not None and record.state == 2
            if done and self.scheduler.observer is not None:
                self.scheduler.observer.host_synced(self, record=record)
            self.respond(request.id, values=[codes.ACL_EVENT_RECORDED_STATUS_COMPLETE if done
                                             else codes.ACL_EVENT_RECORDED_STATUS_NOT_READY])

        self._batch.append((answer, ()))
        return DEFERRED

    def _synchronize_event(self, request):
        event = self._event(request.args[0])
        deadline = self._timeout_deadline(request.args[1])

        def begin():
            record = event.latest_record
            if record is not None and self.scheduler.observer is not None:
                self.scheduler.observer.host_synced(self, record=record)

            def finish(timed_out: bool) -> None:
                if timed_out:
                    self.respond(request.id, codes.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, "event synchronize timed out")
                else:
                    self.respond_failure(request.id, event.context.failure)

            waiter = Waiter(lambda: record is None or record.state == 2, finish, deadline)
            self.scheduler.watch(waiter, tasks=[record] if record is not None else [])

        self._batch.append((begin, ()))
        return DEFERRED

    def _event_elapsed_time(self, request):
        start, end = self._event(request.args[0]), self._event(request.args[1])

        def answer():
            records = (start.latest_record, end.latest_record)
            if None in records:  # CANN: EVENT_RECORDER_NULL, reported as ACL_ERROR_RT_INTERNAL_ERROR
                self.respond(request.id, codes.ACL_ERROR_RT_INTERNAL_ERROR,
                             "both events must have been recorded (event recorder null)")
            elif any(r.state != 2 for r in records):
                self.respond(request.id, codes.ACL_ERROR_RT_EVENT_NOT_COMPLETE,
                             "an event has not completed yet: synchronize it first")
            elif records[1].timestamp < records[0].timestamp:
                self.respond(request.id, codes.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL,
                             "the end event completed before the start event")
            else:
                self.respond(request.id, values=[records[1].timestamp - records[0].timestamp])

        self._batch.append((answer, ()))
        return DEFERRED


class _AsFailure:
    """An NpuError of a rejected asynchronous call, shaped like objects.Failure."""

    def __init__(self, error: NpuError):
        self.code = error.code
        self.message = error.message
        self.seq = getattr(error, "seq", 0)
