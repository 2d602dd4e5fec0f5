"""The raw layer's IPC event calls (aclrtIpcGetEventHandle, aclrtIpcOpenEventHandle).

A mixin of `Runtime` (client/runtime.py). `ipc_events` holds this process's IPC events
(created with ACL_EVENT_IPC, or opened), which the runtime refuses to reset or query with
the deprecated aclrtQueryEvent (207000). What sharing an event means:
server/ipc_events.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.runtime import ContextInfo

IPC_EVENT_HANDLE_SIZE = 64
"""ACL_IPC_EVENT_HANDLE_SIZE: the bytes of an aclrtIpcEventHandle."""


class RuntimeIpcEvents:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    ipc_events: set[int]  # handles of IPC events (created with ACL_EVENT_IPC, or opened)
    event_context: dict[int, ContextInfo]

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def _event(self, handle: int) -> int: ...

    def not_for_ipc(self, event: int, call: str) -> None:
        """207000 if `event` is an IPC event, which `call` does not take."""
        if event in self.ipc_events:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, f"{call} is not supported for IPC events"
            )

    @records_errors
    def ipc_get_event_handle(self, event: int) -> bytes:
        """aclrtIpcGetEventHandle: the event's 64-byte handle (ACL_EVENT_IPC events only)."""
        return self._call(pb.IpcGetEventHandleRequest(event=self._event(event))).handle

    @records_errors
    def ipc_open_event_handle(self, handle: bytes) -> int:
        """aclrtIpcOpenEventHandle: another process's IPC event, in the current context."""
        if len(handle) != IPC_EVENT_HANDLE_SIZE:
            raise invalid(
                f"an IPC event handle has {IPC_EVENT_HANDLE_SIZE} bytes, not {len(handle)}"
            )
        context = self._current()
        reply = self._call(pb.IpcOpenEventHandleRequest(handle=handle, context=context.handle))
        context.events.add(reply.event)
        self.event_context[reply.event] = context
        self.ipc_events.add(reply.event)
        return reply.event
