"""IPC events: an event one client created with ACL_EVENT_IPC, shared with other clients of
the daemon by its aclrtIpcEventHandle (aclrtIpcGetEventHandle / aclrtIpcOpenEventHandle;
the CANN runtime's API reference, 07_event_management.md).

The handle is 64 random bytes the daemon maps to the exporter's event. A client that opens
it gets a handle of its own session (HandleKind.IPC_EVENT) to the same event: a record in
either process is the event's latest record, and a wait, a synchronize or a status query in
either binds to it, as the runtime's shared record slots do. The opened event belongs to
the context it was opened in: that context's failure (ACL_STOP_ON_FAILURE) is what its
synchronize and query report, never the exporter's.

The handle opens while the exporter's event lives: once the exporter destroys it (or its
context, or ends), opening it again fails with 107000; events opened before keep working
until their own processes destroy them. Opening needs no whitelist: the runtime exports the
event's memory with pid verification disabled.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from simnpu.server.core.streams import Context, Event

HANDLE_SIZE = 64
"""ACL_IPC_EVENT_HANDLE_SIZE: the bytes of an aclrtIpcEventHandle."""


def not_for_ipc(call: str) -> NpuError:
    """207000 for a call the runtime refuses for IPC events (reset, timing)."""
    return NpuError(
        codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, f"{call} is not supported for IPC events"
    )


@dataclass(eq=False)
class OpenedEvent:
    """Another client's IPC event as this client opened it, in one of its contexts."""

    event: Event
    context: Context


class IpcEvents:
    """The daemon's exported IPC events by handle. Thread-safe (sessions call it from their
    own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[bytes, Event] = {}
        self._handles: dict[int, bytes] = {}  # id(event) -> its handle, while exported

    def export(self, event: Event, opened: bool) -> bytes:
        """aclrtIpcGetEventHandle: the event's handle (the same at every call); 107000 for an
        event not created with ACL_EVENT_IPC alone, or `opened` by this client from a handle
        that opens no more."""
        if event.flags != codes.ACL_EVENT_IPC:
            raise invalid(
                f"event flags {event.flags:#x}: only an event created with ACL_EVENT_IPC "
                "(aclrtCreateEventExWithFlag) has an IPC handle"
            )
        with self._lock:
            handle = self._handles.get(id(event))
            if handle is None:
                if opened:
                    raise invalid("the exporter of this opened IPC event has destroyed it")
                handle = secrets.token_bytes(HANDLE_SIZE)
                self._handles[id(event)] = handle
                self._events[handle] = event
            return handle

    def open(self, handle: bytes) -> Event:
        """aclrtIpcOpenEventHandle: the exported event; 107000 for a handle no live event
        has (destroyed, forged, or not 64 bytes)."""
        if len(handle) != HANDLE_SIZE:
            raise invalid(f"an IPC event handle has {HANDLE_SIZE} bytes, not {len(handle)}")
        with self._lock:
            event = self._events.get(handle)
        if event is None or event.context.owner.closed:  # (its exporter's session is ending)
            raise invalid(
                "no IPC event has this handle (its event was destroyed, or the handle is wrong)"
            )
        return event

    def withdraw(self, event: Event) -> None:
        """The exporter destroyed `event` (or ended): its handle opens no more."""
        with self._lock:
            handle = self._handles.pop(id(event), None)
            if handle is not None:
                del self._events[handle]
