"""Packed asynchronous command records: the hot path of the protocol, in Item.commands and
in a session's submission ring.

Asynchronous calls (launch, memcpy_async, memset_async, record/reset/wait event, host
callbacks, HCCL collectives) never get a reply, so each travels as one fixed-layout
little-endian record, packed back to back: a 2-byte op code, the kind's fixed fields, and
for a launch its argument buffer. Each kind is one class below, a named tuple of its
fields, with the two halves of its encoding: `pack(*fields)` (the client: one struct call,
no object made) and `unpack_from(buffer, at)` (the daemon). `decode` walks a buffer.

A memory location is a `Location(space, id, offset)` with the spaces of npu.proto's
`Space`: SPACE_DEVICE (offset: the absolute device address), SPACE_PINNED (id: the pinned
segment's handle, offset within it), SPACE_STAGING (offset within the staging area).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.proto.npu_pb2 import SPACE_DEVICE, SPACE_PINNED, SPACE_STAGING, Space

__all__ = [
    "BUILTIN_BINARY",
    "SPACE_DEVICE",
    "SPACE_PINNED",
    "SPACE_STAGING",
    "Collective",
    "CntNotifyRecord",
    "CntNotifyWait",
    "Copy",
    "HostCallback",
    "HostDone",
    "Launch",
    "LaunchDeviceArgs",
    "LaunchWithConfig",
    "Location",
    "Memset",
    "MemsetD32",
    "RandomNum",
    "RecordEvent",
    "RecordNotify",
    "Reduce",
    "ResetEvent",
    "ThreadLimited",
    "ValueWait",
    "ValueWrite",
    "RING_END",
    "RingRequest",
    "RingSite",
    "RingStreamItem",
    "WaitEvent",
    "WaitEventTimeout",
    "WaitNotify",
    "check_cnt_notify",
    "check_value_flag",
    "decode",
]

BUILTIN_BINARY = 1  # handle of the built-in kernel library, present in every session

_OP = struct.Struct("<H")
_record = tuple.__new__  # a record from its fields in order: a NamedTuple without its __new__


class Location(NamedTuple):
    space: Space  # npu.proto's Space
    id: int  # SPACE_PINNED: the segment's handle
    offset: int  # SPACE_DEVICE: the device address; else within the segment


# ---- device work --------------------------------------------------------------------------------
class _LaunchFields(NamedTuple):
    num_blocks: int
    stream: int
    function: int
    args: bytes  # the packed parameter struct (simnpu.proto.kernel_abi.KernelSignature)


_LAUNCH_OP = 1
_LAUNCH_LAYOUT = struct.Struct("<HIQQI")  # op, blocks, stream, function, args length
_pack_launch = _LAUNCH_LAYOUT.pack  # bound once: a launch is the hottest record


class Launch(_LaunchFields):
    """aclrtLaunchKernelWithHostArgs: the argument struct follows the fixed fields."""

    __slots__ = ()
    OP: ClassVar[int] = _LAUNCH_OP
    LAYOUT: ClassVar[struct.Struct] = _LAUNCH_LAYOUT

    @staticmethod
    def pack(num_blocks: int, stream: int, function: int, args: bytes) -> bytes:
        try:
            return _pack_launch(_LAUNCH_OP, num_blocks, stream, function, len(args)) + args
        except struct.error:
            raise _refused(Launch, (num_blocks, stream, function, len(args))) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[Launch, int]:
        _, num_blocks, stream, function, length = cls.LAYOUT.unpack_from(buffer, at)
        start = at + cls.LAYOUT.size
        if len(buffer) - start < length:
            raise _malformed(f"launch arguments truncated at byte {start}")
        args = bytes(buffer[start : start + length])
        return _record(cls, (num_blocks, stream, function, args)), start + length


class _LaunchDeviceArgsFields(NamedTuple):
    num_blocks: int
    stream: int
    function: int
    args_ptr: int  # a device address: read when the launch reaches the head of its stream
    args_size: int


class LaunchDeviceArgs(_LaunchDeviceArgsFields):
    """aclrtLaunchKernel: the argument struct lies in device memory."""

    __slots__ = ()
    OP: ClassVar[int] = 2
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HIQQQI")

    @staticmethod
    def pack(num_blocks: int, stream: int, function: int, args_ptr: int, args_size: int) -> bytes:
        fields = (num_blocks, stream, function, args_ptr, args_size)
        try:
            return LaunchDeviceArgs.LAYOUT.pack(LaunchDeviceArgs.OP, *fields)
        except struct.error:
            raise _refused(LaunchDeviceArgs, fields) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[LaunchDeviceArgs, int]:
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class _LaunchWithConfigFields(NamedTuple):
    num_blocks: int
    stream: int
    function: int
    timeout_us: int  # the launch's own timeout: 0 none (the session's), 2**64 - 1 forever
    args: bytes  # the packed parameter struct
    place_holders: tuple  # ((parameter offset in args, data), ...): data the daemon places


class LaunchWithConfig(_LaunchWithConfigFields):
    """aclrtLaunchKernelWithConfig: the argument struct, then each place holder's parameter
    offset, length and data."""

    __slots__ = ()
    OP: ClassVar[int] = 50
    LAYOUT: ClassVar[struct.Struct] = struct.Struct(
        "<HIQQQIH"
    )  # op, blocks, stream, function, timeout_us, args length, place holders
    PLACE_HOLDER: ClassVar[struct.Struct] = struct.Struct("<II")  # offset, data length

    @staticmethod
    def pack(
        num_blocks: int,
        stream: int,
        function: int,
        timeout_us: int,
        args: bytes,
        place_holders: list[tuple[int, bytes]],
    ) -> bytes:
        fields = (num_blocks, stream, function, timeout_us, len(args), len(place_holders))
        try:
            head = LaunchWithConfig.LAYOUT.pack(LaunchWithConfig.OP, *fields)
        except struct.error:
            raise _refused(LaunchWithConfig, fields) from None
        parts = [head, args]
        for offset, data in place_holders:
            parts += [LaunchWithConfig.PLACE_HOLDER.pack(offset, len(data)), data]
        return b"".join(parts)

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[LaunchWithConfig, int]:
        _, blocks, stream, function, timeout_us, length, count = cls.LAYOUT.unpack_from(buffer, at)
        start = at + cls.LAYOUT.size
        if len(buffer) - start < length:
            raise _malformed(f"launch arguments truncated at byte {start}")
        args = bytes(buffer[start : start + length])
        start += length
        place_holders = []
        for _ in range(count):
            if len(buffer) - start < cls.PLACE_HOLDER.size:
                raise _malformed(f"place holder truncated at byte {start}")
            offset, size = cls.PLACE_HOLDER.unpack_from(buffer, start)
            start += cls.PLACE_HOLDER.size
            if len(buffer) - start < size:
                raise _malformed(f"place-holder data truncated at byte {start}")
            place_holders.append((offset, bytes(buffer[start : start + size])))
            start += size
        fields = (blocks, stream, function, timeout_us, args, tuple(place_holders))
        return _record(cls, fields), start


class _ThreadLimitedFields(NamedTuple):
    limits: int  # the stream whose resource limits bound the launch
    launch: Any  # the launch record that follows (Launch, LaunchDeviceArgs, LaunchWithConfig)


class ThreadLimited(_ThreadLimitedFields):
    """A launch from a thread that uses a stream's resource limits
    (aclrtUseStreamResInCurrentThread): that stream's handle, then the launch's record."""

    __slots__ = ()
    OP: ClassVar[int] = 77
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQ")  # op, the limits' stream

    @classmethod
    def pack(cls, limits: int, launch: bytes) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, limits) + launch
        except struct.error:
            raise _refused(cls, (limits,)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[ThreadLimited, int]:
        _, limits = cls.LAYOUT.unpack_from(buffer, at)
        start = at + cls.LAYOUT.size
        if len(buffer) - start < _OP.size:
            raise _malformed(f"thread-limited launch truncated at byte {start}")
        (op,) = _OP.unpack_from(buffer, start)
        kind = _LAUNCHES.get(op)
        if kind is None:
            raise _malformed(f"op {op} at byte {start} is no launch (a thread-limited record)")
        if len(buffer) - start < kind.LAYOUT.size:
            raise _malformed(f"truncated command op {op} at byte {start}")
        launch, end = kind.unpack_from(buffer, start)
        return _record(cls, (limits, launch)), end


class _CopyFields(NamedTuple):
    stream: int
    dst: Location
    src: Location
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as named tuples allow


class Copy(_CopyFields):
    """aclrtMemcpyAsync between device memory and device or pinned memory."""

    __slots__ = ()
    OP: ClassVar[int] = 3
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQBQQBQQQ")  # op, stream, dst, src, count

    @staticmethod
    def pack(stream: int, dst: Location, src: Location, count: int) -> bytes:
        try:
            return Copy.LAYOUT.pack(Copy.OP, stream, *dst, *src, count)
        except struct.error:
            raise _refused(Copy, (stream, *dst, *src, count)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[Copy, int]:
        f = cls.LAYOUT.unpack_from(buffer, at)
        dst, src = _record(Location, f[2:5]), _record(Location, f[5:8])
        return _record(cls, (f[1], dst, src, f[8])), at + cls.LAYOUT.size


class _MemsetFields(NamedTuple):
    stream: int
    dst: Location
    value: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as named tuples allow


class Memset(_MemsetFields):
    """aclrtMemsetAsync of device or pinned memory."""

    __slots__ = ()
    OP: ClassVar[int] = 4
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQBQQBQ")  # op, stream, dst, value, count

    @staticmethod
    def pack(stream: int, dst: Location, value: int, count: int) -> bytes:
        try:
            return Memset.LAYOUT.pack(Memset.OP, stream, *dst, value, count)
        except struct.error:
            raise _refused(Memset, (stream, *dst, value, count)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[Memset, int]:
        f = cls.LAYOUT.unpack_from(buffer, at)
        return _record(cls, (f[1], _record(Location, f[2:5]), f[5], f[6])), at + cls.LAYOUT.size


class _MemsetD32Fields(NamedTuple):
    stream: int
    dst: Location  # pinned memory (device memory travels as a copy of the pattern)
    value: int  # the 32-bit word
    count: int  # type: ignore[assignment]  # words, not bytes


class MemsetD32(_MemsetD32Fields):
    """aclrtMemsetD32Async of pinned host memory: `count` words of `value`."""

    __slots__ = ()
    OP: ClassVar[int] = 80
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQBQQIQ")  # op, stream, dst, value, count

    @staticmethod
    def pack(stream: int, dst: Location, value: int, count: int) -> bytes:
        try:
            return MemsetD32.LAYOUT.pack(MemsetD32.OP, stream, *dst, value, count)
        except struct.error:
            raise _refused(MemsetD32, (stream, *dst, value, count)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[MemsetD32, int]:
        f = cls.LAYOUT.unpack_from(buffer, at)
        return _record(cls, (f[1], _record(Location, f[2:5]), f[5], f[6])), at + cls.LAYOUT.size


# ---- events and host callbacks ------------------------------------------------------------------
class _EventFields(NamedTuple):
    event: int
    stream: int


class _EventRecord(_EventFields):
    """The layout the three event commands share: op, event, stream."""

    __slots__ = ()
    OP: ClassVar[int]
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQ")

    @classmethod
    def pack(cls, event: int, stream: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, event, stream)
        except struct.error:
            raise _refused(cls, (event, stream)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class RecordEvent(_EventRecord):
    """aclrtRecordEvent."""

    __slots__ = ()
    OP: ClassVar[int] = 5


class ResetEvent(_EventRecord):
    """aclrtResetEvent."""

    __slots__ = ()
    OP: ClassVar[int] = 6


class WaitEvent(_EventRecord):
    """aclrtStreamWaitEvent."""

    __slots__ = ()
    OP: ClassVar[int] = 7


class _WaitEventTimeoutFields(NamedTuple):
    event: int
    stream: int
    timeout: int  # seconds, above 0


class WaitEventTimeout(_WaitEventTimeoutFields):
    """aclrtStreamWaitEventWithTimeout with a timeout: the wait fails when it passes."""

    __slots__ = ()
    OP: ClassVar[int] = 76
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQI")  # op, event, stream, timeout

    @classmethod
    def pack(cls, event: int, stream: int, timeout: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, event, stream, timeout)
        except struct.error:
            raise _refused(cls, (event, stream, timeout)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class _HostCallbackFields(NamedTuple):
    stream: int
    callback: int  # the id the client gave it
    blocking: bool


class HostCallback(_HostCallbackFields):
    """aclrtLaunchCallback / aclrtLaunchHostFunc: the client runs it when the stream gets there."""

    __slots__ = ()
    OP: ClassVar[int] = 8
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQB")  # op, stream, callback, blocking

    @classmethod
    def pack(cls, stream: int, callback: int, blocking: bool) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, stream, callback, blocking)
        except struct.error:
            raise _refused(cls, (stream, callback, blocking)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        _, stream, callback, blocking = cls.LAYOUT.unpack_from(buffer, at)
        return cls(stream, callback, bool(blocking)), at + cls.LAYOUT.size


class HostDone(HostCallback):
    """The client finished blocking host callback `callback` (`blocking` unused)."""

    __slots__ = ()
    OP: ClassVar[int] = 9


class _CollectiveFields(NamedTuple):
    stream: int
    comm: int
    kind: int  # HcclCMDType
    send: int
    recv: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as named tuples allow
    recv_count: int  # alltoall's recvCount; otherwise equal to count
    dtype: int  # HcclDataType
    recv_dtype: int  # alltoall's recvType; otherwise equal to dtype
    op: int  # HcclReduceOp (reducing collectives)
    root: int  # root rank (broadcast, reduce, scatter), peer rank (send, recv)


class Collective(_CollectiveFields):
    """An HCCL collective or send/recv of one rank (simnpu.proto.hccl_types)."""

    __slots__ = ()
    OP: ClassVar[int] = 16
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQHQQQQHHHI")

    @staticmethod
    def pack(*fields: int) -> bytes:
        """The record of a collective with these fields, in the order above."""
        try:
            return Collective.LAYOUT.pack(Collective.OP, *fields)
        except struct.error:
            raise _refused(Collective, fields) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[Collective, int]:
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


# ---- notifies ----------------------------------------------------------------------------------
class _NotifyFields(NamedTuple):
    notify: int
    stream: int


class RecordNotify(_NotifyFields):
    """aclrtRecordNotify."""

    __slots__ = ()
    OP: ClassVar[int] = 45
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQ")  # op, notify, stream

    @classmethod
    def pack(cls, notify: int, stream: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, notify, stream)
        except struct.error:
            raise _refused(cls, (notify, stream)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class _WaitNotifyFields(NamedTuple):
    notify: int
    stream: int
    timeout: int  # seconds; 0 waits forever


class WaitNotify(_WaitNotifyFields):
    """aclrtWaitAndResetNotify."""

    __slots__ = ()
    OP: ClassVar[int] = 46
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQI")  # op, notify, stream, timeout

    @classmethod
    def pack(cls, notify: int, stream: int, timeout: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, notify, stream, timeout)
        except struct.error:
            raise _refused(cls, (notify, stream, timeout)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


# ---- value writes and waits on device words, count notifies ---------------------------------
class _ValueFields(NamedTuple):
    address: int  # the device address of the 64-bit word
    value: int
    flag: int  # ValueWrite: 0; ValueWait: an ACL_STREAM_WAIT_VALUE_* condition
    stream: int


class ValueWrite(_ValueFields):
    """aclrtValueWrite."""

    __slots__ = ()
    OP: ClassVar[int] = 63
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQIQ")  # op, address, value, flag, stream

    @classmethod
    def pack(cls, address: int, value: int, flag: int, stream: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, address, value, flag, stream)
        except struct.error:
            raise _refused(cls, (address, value, flag, stream)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class ValueWait(ValueWrite):
    """aclrtValueWait."""

    __slots__ = ()
    OP: ClassVar[int] = 64


class _CntNotifyRecordFields(NamedTuple):
    notify: int
    stream: int
    mode: int  # ACL_RT_CNT_NOTIFY_RECORD_*
    value: int


class CntNotifyRecord(_CntNotifyRecordFields):
    """aclrtCntNotifyRecord (and aclrtCntNotifyReset: SET_VALUE 0, as the CANN runtime does)."""

    __slots__ = ()
    OP: ClassVar[int] = 65
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQII")  # op, notify, stream, mode, value

    @classmethod
    def pack(cls, notify: int, stream: int, mode: int, value: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, notify, stream, mode, value)
        except struct.error:
            raise _refused(cls, (notify, stream, mode, value)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class _CntNotifyWaitFields(NamedTuple):
    notify: int
    stream: int
    mode: int  # ACL_RT_CNT_NOTIFY_WAIT_*
    value: int
    timeout: int  # seconds; 0 waits forever
    clear: int  # 1: the count goes to 0 when the wait is satisfied


class CntNotifyWait(_CntNotifyWaitFields):
    """aclrtCntNotifyWaitWithTimeout."""

    __slots__ = ()
    OP: ClassVar[int] = 66
    # op, notify, stream, mode, value, timeout, clear
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQIIIB")

    @classmethod
    def pack(cls, notify: int, stream: int, mode: int, value: int, timeout: int, clear: int):
        try:
            return cls.LAYOUT.pack(cls.OP, notify, stream, mode, value, timeout, clear)
        except struct.error:
            raise _refused(cls, (notify, stream, mode, value, timeout, clear)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


# ---- built-in device tasks (simnpu.proto.builtin_tasks) ----------------------------------------
class _ReduceFields(NamedTuple):
    stream: int
    dst: int  # device address: dst = dst (op) src, element-wise
    src: int  # device address
    count: int  # type: ignore[assignment]  # bytes; the field shadows tuple.count
    kind: int  # aclrtReduceKind
    data_type: int  # aclDataType


class Reduce(_ReduceFields):
    """aclrtReduceAsync."""

    __slots__ = ()
    OP: ClassVar[int] = 72
    # op, stream, dst, src, count, kind, data type
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQQQii")

    @classmethod
    def pack(cls, stream: int, dst: int, src: int, count: int, kind: int, data_type: int):
        try:
            return cls.LAYOUT.pack(cls.OP, stream, dst, src, count, kind, data_type)
        except struct.error:
            raise _refused(cls, (stream, dst, src, count, kind, data_type)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


class _RandomNumFields(NamedTuple):
    stream: int
    data_type: int  # aclDataType
    func_type: int  # aclrtRandomNumFuncType
    result: int  # randomResultAddr
    counter: int  # randomCounterAddr (16 bytes)
    parameters: tuple  # the generator's aclrtRandomParaInfos (builtin_tasks.RandomParameter)
    seed: tuple  # randomSeed, a RandomParameter
    num: tuple  # randomNum, a RandomParameter


_PARAMETER = "B8sB"  # aclrtRandomParaInfo: isAddr, valueOrAddr, size


class RandomNum(_RandomNumFields):
    """aclrtRandomNumAsync: the task info's fields (two generator parameters, the second
    all zeros for the dropout bitmask's one)."""

    __slots__ = ()
    OP: ClassVar[int] = 73
    # op, stream, data type, function, result, counter; first, second, seed, num parameters
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQiiQQ" + _PARAMETER * 4)

    @classmethod
    def pack(
        cls,
        stream: int,
        data_type: int,
        func_type: int,
        result: int,
        counter: int,
        parameters: tuple,
        seed: tuple,
        num: tuple,
    ) -> bytes:
        pair = (*parameters, (0, bytes(8), 0))[:2]
        flat = (*pair[0], *pair[1], *seed, *num)
        try:
            return cls.LAYOUT.pack(cls.OP, stream, data_type, func_type, result, counter, *flat)
        except struct.error:
            raise _refused(cls, (stream, data_type, func_type, result, counter)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        f = cls.LAYOUT.unpack_from(buffer, at)
        first, second, seed, num = (tuple(f[i : i + 3]) for i in range(6, 18, 3))
        return _record(cls, (*f[1:6], (first, second), seed, num)), at + cls.LAYOUT.size


_CNT_NOTIFY_RECORD_MODES = (
    codes.ACL_RT_CNT_NOTIFY_RECORD_SET_VALUE_MODE,
    codes.ACL_RT_CNT_NOTIFY_RECORD_ADD_MODE,
    codes.ACL_RT_CNT_NOTIFY_RECORD_BIT_OR_MODE,
    codes.ACL_RT_CNT_NOTIFY_RECORD_BIT_AND_MODE,
)


def check_value_flag(kind: type[ValueWrite], flag: int) -> None:
    """107000 for a flag aclrtValueWrite (reserved: 0) or aclrtValueWait (a condition)
    refuses; both sides check it."""
    if kind is ValueWrite and flag != 0:
        raise invalid(f"aclrtValueWrite flag {flag}: it is reserved and must be 0")
    if kind is ValueWait and not 0 <= flag <= codes.ACL_STREAM_WAIT_VALUE_NOR:
        raise invalid(f"aclrtValueWait flag {flag}: use GEQ (0), EQ (1), AND (2) or NOR (3)")


def check_cnt_notify(record: bool, mode: int, value: int) -> None:
    """107000 for a mode or value aclrtCntNotifyRecord (`record`) or
    aclrtCntNotifyWaitWithTimeout refuses; both sides check it."""
    if record and mode not in _CNT_NOTIFY_RECORD_MODES:
        raise invalid(
            f"count notify record mode {mode}: use SET_VALUE 0, ADD 1, BIT_OR 2, BIT_AND 4"
        )
    if not record and not 0 <= mode <= codes.ACL_RT_CNT_NOTIFY_WAIT_EQUAL_WITH_BITMASK_MODE:
        raise invalid(f"count notify wait mode {mode}: use 0 (LESS) ... 4 (EQUAL_WITH_BITMASK)")
    if not 0 <= value <= 0xFFFFFFFF:
        raise invalid(f"count notify value {value} does not fit 32 bits")


# ---- records only a submission ring carries (simnpu.shm.ring, docs/fast-path.md) --------------
_RING_BYTES = struct.Struct("<HI")  # op, length of what follows


class _RingRequestFields(NamedTuple):
    request: bytes  # a serialized Request


class RingRequest(_RingRequestFields):
    """A request, in the ring as in the stream."""

    __slots__ = ()
    OP: ClassVar[int] = 32

    @staticmethod
    def pack(request: bytes) -> bytes:
        return _RING_BYTES.pack(RingRequest.OP, len(request)) + request

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[RingRequest, int]:
        payload, end = _ring_bytes(buffer, at)
        return cls(payload), end


class RingStreamItem(tuple):
    """The next Item of the gRPC stream belongs here (a request too big for the ring)."""

    __slots__ = ()
    OP: ClassVar[int] = 33
    RECORD: ClassVar[bytes] = _OP.pack(33)

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[RingStreamItem, int]:
        return cls(), at + _OP.size


class _RingSiteFields(NamedTuple):
    site: str  # file:line


class RingSite(_RingSiteFields):
    """The call site of this and the following calls, until the next RingSite (an observed
    client sends it when it changes)."""

    __slots__ = ()
    OP: ClassVar[int] = 34

    @staticmethod
    def pack(site: str) -> bytes:
        text = site.encode("utf-8", "backslashreplace")  # a file name may hold surrogates
        return _RING_BYTES.pack(RingSite.OP, len(text)) + text

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int) -> tuple[RingSite, int]:
        payload, end = _ring_bytes(buffer, at)
        return cls(payload.decode("utf-8", "replace")), end


RING_END_OP = 35  # nothing more before the end of the ring's data
RING_END = _OP.pack(RING_END_OP)


def _ring_bytes(buffer: memoryview, at: int) -> tuple[bytes, int]:
    if len(buffer) - at < _RING_BYTES.size:
        raise _malformed(f"truncated ring record at byte {at}")
    length = _RING_BYTES.unpack_from(buffer, at)[1]
    start = at + _RING_BYTES.size
    if len(buffer) - start < length:
        raise _malformed(f"ring record of {length} bytes truncated at byte {start}")
    return bytes(buffer[start : start + length]), start + length


# ---- model run instances ------------------------------------------------------------------------
class _ReplayModelFields(NamedTuple):
    model: int
    stream: int


class ReplayModel(_ReplayModelFields):
    """aclmdlRIExecuteAsync: one replay of a captured graph, whatever its size
    (docs/graph-capture.md)."""

    __slots__ = ()
    OP: ClassVar[int] = 90
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<HQQ")  # op, model, stream

    @classmethod
    def pack(cls, model: int, stream: int) -> bytes:
        try:
            return cls.LAYOUT.pack(cls.OP, model, stream)
        except struct.error:
            raise _refused(cls, (model, stream)) from None

    @classmethod
    def unpack_from(cls, buffer: memoryview, at: int):
        return _record(cls, cls.LAYOUT.unpack_from(buffer, at)[1:]), at + cls.LAYOUT.size


_KINDS = (
    Launch,
    LaunchDeviceArgs,
    LaunchWithConfig,
    Copy,
    Memset,
    MemsetD32,
    RecordEvent,
    ResetEvent,
    WaitEvent,
    WaitEventTimeout,
    ThreadLimited,
    HostCallback,
    HostDone,
    Collective,
    RecordNotify,
    WaitNotify,
    ValueWrite,
    ValueWait,
    CntNotifyRecord,
    CntNotifyWait,
    Reduce,
    RandomNum,
    ReplayModel,
)
_LAUNCHES = {kind.OP: kind for kind in (Launch, LaunchDeviceArgs, LaunchWithConfig)}
# op -> (the smallest size of its record, its kind's unpack_from)
_COMMANDS = {kind.OP: (kind.LAYOUT.size, kind.unpack_from) for kind in _KINDS}
_RING_COMMANDS = {
    **_COMMANDS,
    RingRequest.OP: (_RING_BYTES.size, RingRequest.unpack_from),
    RingStreamItem.OP: (_OP.size, RingStreamItem.unpack_from),
    RingSite.OP: (_RING_BYTES.size, RingSite.unpack_from),
}


def decode(buffer, ring: bool = False) -> Iterator:
    """Yield the records packed in `buffer`, in order.

    A truncated or unknown record raises NpuError(107000); the records before it have
    already been yielded (and executed), as they would have been on the wire. With `ring`,
    `buffer` is a piece of a submission ring: its own records are allowed too, and RING_END
    or fewer than 2 bytes left end it.
    """
    view = memoryview(buffer)
    at, end = 0, len(view)
    known = _RING_COMMANDS if ring else _COMMANDS
    while at < end:
        if end - at < _OP.size:
            if ring:
                return
            raise _malformed(f"truncated op code at byte {at}")
        (op,) = _OP.unpack_from(view, at)
        entry = known.get(op)
        if entry is None:
            if ring and op == RING_END_OP:
                return
            raise _malformed(f"unknown command op {op} at byte {at}")
        if end - at < entry[0]:
            raise _malformed(f"truncated command op {op} at byte {at}")
        record, at = entry[1](view, at)
        yield record


def _refused(kind: Any, values: tuple) -> NpuError:
    """107000 for a record of `kind` whose layout refuses one of `values` (its packed fields
    in order, a location's three as three), naming the first that does not fit: pack's slow
    path, so that the caller gets an ACL code rather than struct.error."""
    names = []
    for name in kind._fields:
        if name in ("dst", "src"):
            names += [f"{name}.{part}" for part in Location._fields]
        else:
            names.append(f"len({name})" if name == "args" else name)
    letters = kind.LAYOUT.format.lstrip("<")[1:]  # after the op
    for letter, name, value in zip(letters, names, values):
        try:
            struct.pack("<" + letter, value)
        except struct.error:
            field = f"{struct.calcsize(letter) * 8}-bit{' unsigned' if letter.isupper() else ''}"
            return invalid(f"{kind.__name__}: {name} {value!r} does not fit its {field} field")
    return invalid(f"{kind.__name__}: the values {values!r} do not fit its record")


def _malformed(what: str) -> NpuError:
    return NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"malformed command buffer: {what}")
