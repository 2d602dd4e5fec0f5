"""rt.sync: synchronize and query streams, events and the device -- decided on the streams'
completion signals when they prove the outcome (docs/fast-path.md), else by a request.

A stream's signal (shm/notify.py's StreamSignal, in the session's notify area) holds the
sequence number of the stream's last completed task, with DIRTY set when a synchronize would
report a failure. If the stream's last command is this process's latest call whose failure
is reported later, a clean signal at or past it means "done, and nothing to report"; a dirty
one means the daemon must be asked. A wait polls the signal for a while (fast_path.POLL_S),
then sleeps on it.

The signals decide nothing while the session is observed (tracing and checking see every
synchronize), a capture runs (the daemon refuses the call), or a context stops on failure
(its failure is every later call's, and a signal written clean before it stays clean); once
a model was made, only calls on one stream (replays run tasks and record events the call log
does not show; a call on one stream sees a replay as that stream's command). The graphs part
tells this one when captures and models change (`graphs_changed`); the observer's flags
are read at each call.

These calls are given no call site: most are decided without a request, and the site of
one that asks the daemon is taken when it does (client/runtime/calls.py), not at every call.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from simnpu.client import fast_path
from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import wire_int
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import bad_handle
from simnpu.shm.notify import DIRTY, SEQ_MASK

if TYPE_CHECKING:
    from simnpu.client.observe import ClientObserver
    from simnpu.client.runtime.contexts import ContextRecord, StreamRecord
    from simnpu.client.runtime.shared import Shared
    from simnpu.client.transport import Connection
    from simnpu.shm.notify import NotifyArea


class StreamSignals:
    """The completion signals of one session's streams as the client reads them: waits on
    them and the outcomes they prove (the calls' rules are Synchronization's)."""

    def __init__(self, connection: Connection, area: NotifyArea, streams: dict[int, StreamRecord]):
        self.connection = connection
        self.area = area
        self._streams = streams  # the stream records (their signals' slots)
        self.decided = 0  # calls decided here, without a request (a statistic)

    def _covers(self, slot: int, seq: int) -> bool:
        """Signal `slot` is clean and at or past `seq`."""
        word = self.area.word(slot)
        return not word & DIRTY and word >= seq

    def _wait(
        self,
        stream: StreamRecord,
        seq: int,
        deadline: float | None,
        still: Callable[[], bool] | None = None,
    ) -> bool | None:
        """Wait for `stream`'s signal to reach `seq` -- polling it (fast_path.POLL_S, longer
        on an ACL_STREAM_FAST_SYNC stream, not at all after a wait that outlasted it),
        yielding the CPU between looks, then sleeping on it: True if it did clean; False if
        dirty, the session broke, or `still()` no longer holds (the daemon must be asked);
        None at the monotonic `deadline`. Blocks."""
        slot = stream.slot
        word = self.area.word(slot)
        if word & SEQ_MASK >= seq:
            return not word & DIRTY
        started = time.monotonic()
        if stream.fast_sync:
            poll_s = fast_path.FAST_SYNC_POLL_S
        else:
            poll_s = 0.0 if stream.long_wait else fast_path.POLL_S
        try:
            return self._wait_from(word, slot, seq, deadline, started + poll_s, still)
        finally:
            stream.long_wait = time.monotonic() - started > fast_path.POLL_S

    def _wait_from(
        self,
        word: int,
        slot: int,
        seq: int,
        deadline: float | None,
        polled_until: float,
        still: Callable[[], bool] | None,
    ) -> bool | None:
        """_wait once it saw `word`, short of `seq`: polling until `polled_until`."""
        area, connection = self.area, self.connection
        connection.ring_doorbell()  # before waiting: a wake-up of the daemon the launch missed
        while True:
            if connection.broken is not None or (still is not None and not still()):
                return False  # the request raises the session's error, or decides
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if now < polled_until:
                os.sched_yield()  # (without the GIL: the process's other threads run)
            else:
                slice_s = (
                    fast_path.SLICE_S
                    if deadline is None
                    else min(fast_path.SLICE_S, deadline - now)
                )
                area.wait_word(slot, word, slice_s)
            word = area.word(slot)
            if word & SEQ_MASK >= seq:
                return not word & DIRTY

    def _outcome(self, outcome: bool | None, timeout_ms: int) -> int | None:
        """What a synchronize tells its caller: None decided (success), else the timeout (ms)
        to ask the daemon with, 0 when the wait used it up."""
        if outcome is None:
            return 0
        if outcome:
            self.decided += 1
            return None
        return timeout_ms

    def synchronize(self, stream: StreamRecord, timeout_ms: int) -> int | None:
        """aclrtSynchronizeStream(WithTimeout) on `stream`'s signal, if that can decide it:
        None when it did (success), else the timeout (ms) to ask the daemon with, 0 when
        this wait used up `timeout_ms`. Blocks."""
        seq = self.connection.log.covering_command(stream.handle)
        if stream.slot < 0 or not seq or timeout_ms < -1:
            return timeout_ms
        return self._outcome(self._wait(stream, seq, _deadline(timeout_ms)), timeout_ms)

    def stream_complete(self, stream: StreamRecord) -> bool:
        """aclrtStreamQuery: True when `stream`'s signal proves its work done with nothing to
        report; False when the daemon must answer (running, failed, or unknown here)."""
        seq = self.connection.log.covering_command(stream.handle)
        if stream.slot < 0 or not seq or not self._covers(stream.slot, seq):
            return False
        self.decided += 1
        return True

    def event_complete(self, latest: tuple[int, int]) -> bool:
        """aclrtQueryEventStatus: True when the signal of the stream of the event's latest
        record (`latest`: its stream and number) proves it ran, with no failure before it;
        False: the daemon must answer."""
        stream = self._streams.get(latest[0])
        if stream is None or stream.slot < 0 or not self._covers(stream.slot, latest[1]):
            return False
        self.decided += 1
        return True

    def synchronize_event(self, latest: tuple[int, int], timeout_ms: int) -> int | None:
        """aclrtSynchronizeEvent(WithTimeout) on the signal of the stream of the event's
        latest record (`latest`): it is waited on while that record is its stream's last
        command (the signal is written when a stream drains). Returns as synchronize.
        Blocks."""
        handle, seq = latest
        stream = self._streams.get(handle)
        if stream is None or stream.slot < 0 or timeout_ms < -1:
            return timeout_ms
        log = self.connection.log
        outcome = self._wait(
            stream, seq, _deadline(timeout_ms), lambda: log.last_command(handle) == seq
        )
        return self._outcome(outcome, timeout_ms)

    def synchronize_streams(self, streams: Iterable[StreamRecord], timeout_ms: int) -> int | None:
        """aclrtSynchronizeDevice(WithTimeout) of a device whose streams are `streams`: each
        stream's signal at its last command and clean, and this process's latest call whose
        failure is reported later covered by a clean signal (no call is left to be
        rejected). Returns as synchronize. Blocks."""
        if timeout_ms < -1:
            return timeout_ms
        log = self.connection.log
        latest = log.last_deferred()
        waits = []
        for stream in streams:
            if stream.slot < 0:
                return timeout_ms
            waits.append((stream, log.last_command(stream.handle)))
        deadline = _deadline(timeout_ms)
        for stream, seq in waits:
            outcome = self._wait(stream, seq, deadline)
            if not outcome:
                return self._outcome(outcome, timeout_ms)
        if latest and all(seq != latest for _, seq in waits):  # a call elsewhere, after these
            slots = [s.slot for s in list(self._streams.values()) if s.slot >= 0]
            if not any(self._covers(slot, latest) for slot in slots):
                return timeout_ms
        self.decided += 1
        return None


def _deadline(timeout_ms: int) -> float | None:
    """The monotonic time a wait of `timeout_ms` ends (-1: never)."""
    return None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000


class Synchronization:
    """Synchronize and query calls (see the module docstring)."""

    def __init__(self, shared: Shared, observer: ClientObserver, area: NotifyArea | None):
        self._calls, self._log = shared.calls, shared.connection.log
        self._contexts = contexts = shared.contexts
        self._streams, self._events = contexts.streams, contexts.events
        self._observer = observer
        self._signals = (
            None if area is None else StreamSignals(shared.connection, area, contexts.streams)
        )
        self._capturing = False  # a stream of this process is being captured
        self._models_made = False  # this process made a model run instance

    @property
    def decided(self) -> int:
        """How many calls the signals decided without a request (a statistic)."""
        return self._signals.decided if self._signals is not None else 0

    def graphs_changed(self, capturing: bool, models_made: bool) -> None:
        """The graphs part says whether a stream of this process is being captured and
        whether a model run instance was ever made (see the module docstring)."""
        self._capturing = capturing
        self._models_made = models_made

    def _deciding(self, *contexts: ContextRecord, one_stream: bool = False) -> StreamSignals | None:
        """The completion signals, if they may decide a call on work of `contexts`
        (`one_stream`: a call on one stream's work)."""
        signals = self._signals
        if (
            signals is None
            or (self._models_made and not one_stream)
            or self._capturing
            or self._observer.flags
        ):
            return None
        for context in contexts:  # (a loop: a generator would cost every synchronize ~0.3 µs)
            if context.stops_on_failure:
                return None
        return signals

    # ---- streams -------------------------------------------------------------------------------
    @records_errors
    def synchronize_stream(self, handle: int, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeStream(WithTimeout). Blocks; 507046 on timeout. Decided on the
        stream's completion signal when that can prove it."""
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._contexts.stream_record(handle)
        if timeout_ms != -1:  # (forever needs no check)
            wire_int(timeout_ms, "timeout_ms")
        signals = self._deciding(stream.context, one_stream=True)
        if signals is not None:
            remaining = signals.synchronize(stream, timeout_ms)
            if remaining is None:
                return
            timeout_ms = remaining
        self._calls.request(
            pb.SynchronizeStreamRequest(stream=stream.handle, timeout_ms=timeout_ms)
        )

    @records_errors
    def stream_query(self, handle: int) -> int:
        """aclrtStreamQuery: ACL_STREAM_STATUS_COMPLETE or _NOT_READY. Complete without a
        request when the stream's signal proves it (as synchronize_stream). Blocks."""
        stream = self._contexts.stream_record(handle)
        signals = self._deciding(stream.context, one_stream=True)
        if signals is not None and signals.stream_complete(stream):
            return codes.ACL_STREAM_STATUS_COMPLETE
        return self._calls.request(pb.QueryStreamRequest(stream=stream.handle)).status

    # ---- events --------------------------------------------------------------------------------
    def _event_signals(self, event: int) -> tuple[StreamSignals | None, tuple[int, int] | None]:
        """The signals, if they may decide a call on `event` (its own, of a context that
        does not stop on failure, recorded last on a stream of such a context), and the
        stream and number of its latest record."""
        record = self._events.get(event)
        if record is None:
            raise bad_handle("event", event)
        latest = record.latest
        stream = None if latest is None else self._streams.get(latest[0])
        if stream is None:
            return None, None
        return self._deciding(record.context, stream.context), latest

    @records_errors
    def query_event_status(self, event: int) -> int:
        """aclrtQueryEventStatus: ACL_EVENT_RECORDED_STATUS_COMPLETE (1) or _NOT_READY (0).
        Raises only a stopped context's failure (ACL_STOP_ON_FAILURE). Complete without a
        request when the signal of the latest record's stream proves it. Blocks."""
        signals, latest = self._event_signals(event)
        if signals is not None and latest is not None and signals.event_complete(latest):
            return codes.ACL_EVENT_RECORDED_STATUS_COMPLETE
        reply = self._calls.request(pb.QueryEventRequest(event=event))
        if reply.HasField("unreported_failure"):
            self._warn_unreported(reply.unreported_failure, "aclrtQueryEventStatus")
        return reply.status

    @records_errors
    def synchronize_event(self, event: int, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeEvent(WithTimeout). Blocks; 507047 on timeout. Raises only a
        stopped context's failure (ACL_STOP_ON_FAILURE); in ACL_CONTINUE_ON_FAILURE a task
        that failed before the record is reported by its stream's next synchronize, and
        this call warns about it on stderr. Decided on the signal of the latest record's
        stream when that proves it."""
        wire_int(timeout_ms, "timeout_ms")
        signals, latest = self._event_signals(event)
        if signals is not None and latest is not None:
            remaining = signals.synchronize_event(latest, timeout_ms)
            if remaining is None:
                return
            timeout_ms = remaining
        reply = self._calls.request(pb.SynchronizeEventRequest(event=event, timeout_ms=timeout_ms))
        if reply is not None and reply.HasField("unreported_failure"):
            self._warn_unreported(reply.unreported_failure, "aclrtSynchronizeEvent")

    def _warn_unreported(self, failure: pb.UnreportedFailure, call: str) -> None:
        """One stderr warning for a failure an event's success does not report (ACL semantics
        keep the call's code 0): which task, where it was submitted, who will report it."""
        site = self._log.site_of(failure.task_seq) or "an earlier call"
        summary = failure.message.strip().splitlines()[-1] if failure.message.strip() else ""
        reporter = (
            f"the next aclrtSynchronizeStream of stream {failure.stream:#x} or "
            "aclrtSynchronizeDevice"
            if failure.stream
            else "the next synchronize of any stream or of the device"
        )
        sys.stderr.write(
            f"simnpu: warning: {call} returned success (ACL_CONTINUE_ON_FAILURE), but task "
            f"{failure.task_seq} submitted at {site} before the event's record failed with "
            f"{failure.code}: {summary}\n"
            f"simnpu: the failure will be reported by {reporter}; results after it may be "
            "wrong. Synchronize the stream, or set ACL_STOP_ON_FAILURE to have event calls "
            "report it.\n"
        )

    # ---- the device ----------------------------------------------------------------------------
    @records_errors
    def synchronize_device(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeDevice(WithTimeout): wait for all this process's work on the
        current device (every stream of its contexts there). Blocks; raises the first
        failure of that work. Decided on the streams' signals when they prove it."""
        wire_int(timeout_ms, "timeout_ms")
        device = self._contexts.current().device
        contexts = self._contexts.of_device(device)
        signals = self._deciding(*contexts)
        if signals is not None:
            streams = [
                self._streams[stream] for context in contexts for stream in list(context.streams)
            ]
            remaining = signals.synchronize_streams(streams, timeout_ms)
            if remaining is None:
                return
            timeout_ms = remaining
        self._calls.request(pb.SynchronizeDeviceRequest(device=device, timeout_ms=timeout_ms))
