"""The raw layer's notify calls (aclrtCreateNotify ... aclrtNotifyImportByKey).

A mixin of `Runtime` (client/runtime.py); `notifies` (handle -> device) holds the notifies
this process created or imported, so that a bad handle is refused at once. What a notify
is, and the rules of sharing one between processes: server/notifies.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import wire_int
from simnpu.client.transport import caller_site
from simnpu.proto import commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import bad_handle, invalid

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.runtime import ContextInfo
    from simnpu.client.transport import Connection

NOTIFY_KEY_LENGTH = 65
"""The key buffer aclrtNotifyGetExportKey fills (at least 65 bytes)."""


class RuntimeNotify:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    connection: Connection
    notifies: dict[int, int]  # notify handle -> its device

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def stream(self, handle: int) -> int: ...

    def _notify(self, handle: int) -> int:
        if handle not in self.notifies:
            raise bad_handle("notify", handle)
        return handle

    @records_errors
    def create_notify(self, flags: int) -> int:
        """aclrtCreateNotify on the current device."""
        context = self._current()
        wire_int(flags, "flag")
        reply = self._call(pb.CreateNotifyRequest(context=context.handle, flags=flags))
        self.notifies[reply.notify] = context.device
        return reply.notify

    @records_errors
    def destroy_notify(self, handle: int) -> None:
        """aclrtDestroyNotify."""
        self._call(pb.DestroyNotifyRequest(notify=self._notify(handle)))
        del self.notifies[handle]

    @records_errors
    def record_notify(self, notify: int, stream: int) -> None:
        """aclrtRecordNotify (async)."""
        notify, stream = self._notify(notify), self.stream(stream)
        self.connection.send_command(
            commands.RecordNotify.pack(notify, stream), caller_site(), stream
        )

    @records_errors
    def wait_and_reset_notify(self, notify: int, stream: int, timeout_s: int) -> None:
        """aclrtWaitAndResetNotify (async): timeout in seconds, 0 waits forever."""
        notify, stream = self._notify(notify), self.stream(stream)
        self.connection.send_command(
            commands.WaitNotify.pack(notify, stream, timeout_s), caller_site(), stream
        )

    @records_errors
    def notify_get_export_key(self, notify: int, flags: int) -> str:
        """aclrtNotifyGetExportKey."""
        wire_int(flags, "flags")
        reply = self._call(pb.NotifyExportRequest(notify=self._notify(notify), flags=flags))
        return reply.key

    @records_errors
    def notify_set_import_pid(self, notify: int, pids: list[int]) -> None:
        """aclrtNotifySetImportPid."""
        for pid in pids:
            wire_int(pid, "pid")
        self._call(pb.NotifySetImportPidRequest(notify=self._notify(notify), pids=pids))

    @records_errors
    def notify_import_by_key(self, key: str, flags: int) -> int:
        """aclrtNotifyImportByKey: the notify in this process."""
        if not key or len(key) >= NOTIFY_KEY_LENGTH:
            raise invalid(f"{key!r} is not a notify key")
        wire_int(flags, "flags")
        reply = self._call(pb.NotifyImportRequest(key=key, flags=flags))
        self.notifies[reply.notify] = reply.device
        return reply.notify
