"""What a client asks of events, answered from their latest records under the scheduler lock:
whether one is complete (aclrtQueryEventStatus), the time between two
(aclrtEventElapsedTime) and when one ran (aclrtEventGetTimestamp), with the CANN runtime's
codes. Their handlers are server/control/handlers/event_calls.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.tasks import TaskState

if TYPE_CHECKING:
    from simnpu.server.core.streams import Event


def complete(event: Event) -> bool:
    """Whether the event's latest record has run; an IPC event never recorded is complete
    (IpcEvent::IpcEventQuery), another event never recorded is not."""
    record = event.latest_record
    if record is None:
        return event.flags == codes.ACL_EVENT_IPC
    return record.state == TaskState.DONE


def elapsed_ns(start: Event, end: Event) -> int:
    """Nanoseconds between the runs of the two events' latest records. Never recorded: the
    runtime's EVENT_RECORDER_NULL, reported as ACL_ERROR_RT_INTERNAL_ERROR; one not run yet:
    ACL_ERROR_RT_EVENT_NOT_COMPLETE; the end before the start:
    ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL."""
    first, last = start.latest_record, end.latest_record
    if first is None or last is None:
        raise NpuError(
            codes.ACL_ERROR_RT_INTERNAL_ERROR,
            "both events must have been recorded (event recorder null)",
        )
    if first.state != TaskState.DONE or last.state != TaskState.DONE:
        raise NpuError(
            codes.ACL_ERROR_RT_EVENT_NOT_COMPLETE,
            "an event has not completed yet: synchronize it first",
        )
    if last.timestamp < first.timestamp:
        raise NpuError(
            codes.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL,
            "the end event completed before the start event",
        )
    return last.timestamp - first.timestamp


def timestamp_us(event: Event) -> int:
    """Microseconds of the run of the event's latest record, on the device clock the
    scheduler keeps (CLOCK_MONOTONIC: time since the host system started). Never recorded:
    EVENT_RECORDER_NULL (ACL_ERROR_RT_INTERNAL_ERROR, as for the elapsed time); recorded but
    not run yet: ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID."""
    record = event.latest_record
    if record is None:
        raise NpuError(
            codes.ACL_ERROR_RT_INTERNAL_ERROR,
            "the event has not been recorded (event recorder null)",
        )
    if record.state != TaskState.DONE:
        raise NpuError(
            codes.ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID,
            "the event's latest record has not run yet: synchronize it first",
        )
    return record.timestamp // 1000
