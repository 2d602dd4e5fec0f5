"""rt.notifies: notifies (aclrtCreateNotify ... aclrtNotifyImportByKey), count notifies
(aclrtCntNotifyCreate ... aclrtCntNotifyGetId) and stream memory operations (aclrtValueWrite,
aclrtValueWait: a 64-bit word of device memory written, or waited on, in stream order).

The notifies this process created or imported (handle -> device) and its count notifies
(handle -> id) are kept here, so that a bad handle is refused at once and
aclrtCntNotifyGetId needs no request. What a notify is, and the rules of sharing one between
processes: server/core/notifies.py; count notifies: server/core/cnt_notifies.py; values:
server/core/tasks/value.py. A value's word must be 8-byte aligned and lie in an allocation of
this process; the daemon checks it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import wire_int
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import bad_handle, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.contexts import ContextRecord
    from simnpu.client.runtime.shared import Shared

NOTIFY_KEY_LENGTH = 65
"""The key buffer aclrtNotifyGetExportKey fills (at least 65 bytes)."""
WORD_BYTES = 8


class Notifies:
    """Notify, count notify and value calls (see the module docstring)."""

    def __init__(self, shared: Shared):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._allocations = shared.allocations
        self._notifies: dict[int, int] = {}  # notify handle -> its device (created or imported)
        self._cnt_notifies: dict[int, int] = {}  # count notify handle -> its id

    def _create(self, request: type, flags: int, site: str | None) -> tuple[Any, ContextRecord]:
        """The reply to a request for a (count) notify of the current context, and that
        context."""
        context = self._contexts.current()
        wire_int(flags, "flag")
        return self._calls.request(request(context=context.handle, flags=flags), site), context

    # ---- notifies ------------------------------------------------------------------------------
    def _notify(self, handle: int) -> int:
        return _known(self._notifies, handle, "notify")

    @records_errors
    def create_notify(self, flags: int, site: str | None = None) -> int:
        """aclrtCreateNotify on the current device. Blocks."""
        reply, context = self._create(pb.CreateNotifyRequest, flags, site)
        self._notifies[reply.notify] = context.device
        return reply.notify

    @records_errors
    def destroy_notify(self, handle: int, site: str | None = None) -> None:
        """aclrtDestroyNotify. Blocks."""
        self._calls.request(pb.DestroyNotifyRequest(notify=self._notify(handle)), site)
        del self._notifies[handle]

    @records_errors
    def record_notify(self, notify: int, stream: int, site: str | None = None) -> None:
        """aclrtRecordNotify (async)."""
        notify, stream = self._notify(notify), self._contexts.stream(stream)
        self._calls.command(commands.RecordNotify.pack(notify, stream), stream, site)

    @records_errors
    def wait_and_reset_notify(
        self, notify: int, stream: int, timeout_s: int, site: str | None = None
    ) -> None:
        """aclrtWaitAndResetNotify (async): timeout in seconds, 0 waits forever."""
        notify, stream = self._notify(notify), self._contexts.stream(stream)
        self._calls.command(commands.WaitNotify.pack(notify, stream, timeout_s), stream, site)

    @records_errors
    def notify_get_export_key(self, notify: int, flags: int, site: str | None = None) -> str:
        """aclrtNotifyGetExportKey. Blocks."""
        wire_int(flags, "flags")
        request = pb.NotifyExportRequest(notify=self._notify(notify), flags=flags)
        return self._calls.request(request, site).key

    @records_errors
    def notify_set_import_pid(self, notify: int, pids: list[int], site: str | None = None) -> None:
        """aclrtNotifySetImportPid. Blocks."""
        for pid in pids:
            wire_int(pid, "pid")
        request = pb.NotifySetImportPidRequest(notify=self._notify(notify), pids=pids)
        self._calls.request(request, site)

    @records_errors
    def notify_import_by_key(self, key: str, flags: int, site: str | None = None) -> int:
        """aclrtNotifyImportByKey: the notify in this process. Blocks."""
        if not key or len(key) >= NOTIFY_KEY_LENGTH:
            raise invalid(f"{key!r} is not a notify key")
        wire_int(flags, "flags")
        reply = self._calls.request(pb.NotifyImportRequest(key=key, flags=flags), site)
        self._notifies[reply.notify] = reply.device
        return reply.notify

    # ---- count notifies ------------------------------------------------------------------------
    def _cnt_notify(self, handle: int) -> int:
        return _known(self._cnt_notifies, handle, "count notify")

    @records_errors
    def cnt_notify_create(self, flags: int, site: str | None = None) -> int:
        """aclrtCntNotifyCreate on the current device (flag reserved: 0). Blocks."""
        reply, _ = self._create(pb.CntNotifyCreateRequest, flags, site)
        self._cnt_notifies[reply.cnt_notify] = reply.id
        return reply.cnt_notify

    @records_errors
    def cnt_notify_destroy(self, handle: int, site: str | None = None) -> None:
        """aclrtCntNotifyDestroy. Blocks."""
        request = pb.CntNotifyDestroyRequest(cnt_notify=self._cnt_notify(handle))
        self._calls.request(request, site)
        del self._cnt_notifies[handle]

    @records_errors
    def cnt_notify_get_id(self, handle: int) -> int:
        """aclrtCntNotifyGetId."""
        return self._cnt_notifies[self._cnt_notify(handle)]

    @records_errors
    def cnt_notify_record(
        self, notify: int, stream: int, mode: int, value: int, site: str | None = None
    ) -> None:
        """aclrtCntNotifyRecord (async)."""
        notify, stream = self._cnt_notify(notify), self._contexts.stream(stream)
        commands.check_cnt_notify(True, mode, value)
        record = commands.CntNotifyRecord.pack(notify, stream, mode, value)
        self._calls.command(record, stream, site)

    @records_errors
    def cnt_notify_reset(self, notify: int, stream: int, site: str | None = None) -> None:
        """aclrtCntNotifyReset (async): a record of 0 in SET_VALUE mode, as in the CANN runtime."""
        notify, stream = self._cnt_notify(notify), self._contexts.stream(stream)
        record = commands.CntNotifyRecord.pack(
            notify, stream, codes.ACL_RT_CNT_NOTIFY_RECORD_SET_VALUE_MODE, 0
        )
        self._calls.command(record, stream, site)

    @records_errors
    def cnt_notify_wait_with_timeout(
        self,
        notify: int,
        stream: int,
        mode: int,
        value: int,
        timeout_s: int,
        clear: bool,
        site: str | None = None,
    ) -> None:
        """aclrtCntNotifyWaitWithTimeout (async): timeout in seconds, 0 waits forever."""
        notify, stream = self._cnt_notify(notify), self._contexts.stream(stream)
        commands.check_cnt_notify(False, mode, value)
        record = commands.CntNotifyWait.pack(notify, stream, mode, value, timeout_s, int(clear))
        self._calls.command(record, stream, site)

    # ---- values --------------------------------------------------------------------------------
    def _word(self, address: int) -> None:
        if address % WORD_BYTES:
            raise invalid(f"{address:#x} is not 8-byte aligned (a value is a 64-bit word)")
        self._allocations.device_range(address, WORD_BYTES)

    @records_errors
    def value_write(
        self, address: int, value: int, flag: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtValueWrite (async): flag is reserved (0)."""
        stream = self._contexts.stream(stream)
        commands.check_value_flag(commands.ValueWrite, flag)
        self._word(address)
        self._calls.command(commands.ValueWrite.pack(address, value, flag, stream), stream, site)

    @records_errors
    def value_wait(
        self, address: int, value: int, flag: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtValueWait (async): the stream waits until condition `flag` holds for the word."""
        stream = self._contexts.stream(stream)
        commands.check_value_flag(commands.ValueWait, flag)
        self._word(address)
        self._calls.command(commands.ValueWait.pack(address, value, flag, stream), stream, site)


def _known(table: dict[int, int], handle: int, kind: str) -> int:
    """`handle`, if `table` holds it (107017 for a handle of no `kind` of this process)."""
    if handle not in table:
        raise bad_handle(kind, handle)
    return handle
