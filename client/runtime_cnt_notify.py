"""The raw layer's count notify calls (aclrtCntNotifyCreate ... aclrtCntNotifyGetId).

A mixin of `Runtime` (client/runtime.py); `cnt_notifies` (handle -> its id) holds the count
notifies this process created, so that a bad handle is refused at once and
aclrtCntNotifyGetId needs no request. What a count notify is: server/cnt_notifies.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import wire_int
from simnpu.client.transport import caller_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import bad_handle

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.runtime import ContextInfo
    from simnpu.client.transport import Connection


class RuntimeCntNotify:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    connection: Connection
    cnt_notifies: dict[int, int]  # count notify handle -> its id

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def stream(self, handle: int) -> int: ...

    def _cnt_notify(self, handle: int) -> int:
        if handle not in self.cnt_notifies:
            raise bad_handle("count notify", handle)
        return handle

    @records_errors
    def cnt_notify_create(self, flags: int) -> int:
        """aclrtCntNotifyCreate on the current device (flag reserved: 0)."""
        context = self._current()
        wire_int(flags, "flag")
        reply = self._call(pb.CntNotifyCreateRequest(context=context.handle, flags=flags))
        self.cnt_notifies[reply.cnt_notify] = reply.id
        return reply.cnt_notify

    @records_errors
    def cnt_notify_destroy(self, handle: int) -> None:
        """aclrtCntNotifyDestroy."""
        self._call(pb.CntNotifyDestroyRequest(cnt_notify=self._cnt_notify(handle)))
        del self.cnt_notifies[handle]

    @records_errors
    def cnt_notify_get_id(self, handle: int) -> int:
        """aclrtCntNotifyGetId."""
        return self.cnt_notifies[self._cnt_notify(handle)]

    @records_errors
    def cnt_notify_record(self, notify: int, stream: int, mode: int, value: int) -> None:
        """aclrtCntNotifyRecord (async)."""
        notify, stream = self._cnt_notify(notify), self.stream(stream)
        commands.check_cnt_notify(True, mode, value)
        self.connection.send_command(
            commands.CntNotifyRecord.pack(notify, stream, mode, value), caller_site(), stream
        )

    @records_errors
    def cnt_notify_reset(self, notify: int, stream: int) -> None:
        """aclrtCntNotifyReset (async): a record of 0 in SET_VALUE mode, as in the CANN runtime."""
        notify, stream = self._cnt_notify(notify), self.stream(stream)
        record = commands.CntNotifyRecord.pack(
            notify, stream, codes.ACL_RT_CNT_NOTIFY_RECORD_SET_VALUE_MODE, 0
        )
        self.connection.send_command(record, caller_site(), stream)

    @records_errors
    def cnt_notify_wait_with_timeout(
        self, notify: int, stream: int, mode: int, value: int, timeout_s: int, clear: bool
    ) -> None:
        """aclrtCntNotifyWaitWithTimeout (async): timeout in seconds, 0 waits forever."""
        notify, stream = self._cnt_notify(notify), self.stream(stream)
        commands.check_cnt_notify(False, mode, value)
        record = commands.CntNotifyWait.pack(notify, stream, mode, value, timeout_s, int(clear))
        self.connection.send_command(record, caller_site(), stream)
