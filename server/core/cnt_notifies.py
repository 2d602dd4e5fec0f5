"""Count notifies (aclrtCntNotify*): a 32-bit count on a device that streams set, add to or
mask (aclrtCntNotifyRecord), reset to 0 (aclrtCntNotifyReset) and wait on with a condition
(aclrtCntNotifyWaitWithTimeout, optionally clearing it when satisfied); the CANN runtime's
API reference, 09_cntNotify_management.md.

A wait is a condition on the count at the time its stream reaches it, re-checked at every
record of the notify; unlike a notify's flag the count is not cleared by a wait unless the
wait asks (`isClear`). Count notifies are not shared between processes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.reserves import Reserves

if TYPE_CHECKING:
    from simnpu.server.core.streams import Stream

MAX_CNT_NOTIFIES_PER_DEVICE = 8192
"""Count notifies one device has for all its clients (as many as notifies)."""

COUNT_MASK = 0xFFFFFFFF


@dataclass(eq=False)
class CntNotify:
    device: int
    id: int  # aclrtCntNotifyGetId: unique among the device's live count notifies
    count: int = 0
    waiting: list[Stream] = field(default_factory=list)  # streams whose head waits on it
    creator: int = 0  # the id of the client that created it


def recorded(count: int, mode: int, value: int) -> int:
    """The count after a record of `mode` with `value` (a 32-bit count: ADD wraps)."""
    if mode == codes.ACL_RT_CNT_NOTIFY_RECORD_SET_VALUE_MODE:
        return value
    if mode == codes.ACL_RT_CNT_NOTIFY_RECORD_ADD_MODE:
        return (count + value) & COUNT_MASK
    if mode == codes.ACL_RT_CNT_NOTIFY_RECORD_BIT_OR_MODE:
        return count | value
    return count & value


def satisfied(count: int, mode: int, value: int) -> bool:
    """Whether a wait of `mode` for `value` is released by `count`."""
    if mode == codes.ACL_RT_CNT_NOTIFY_WAIT_LESS_MODE:
        return count < value
    if mode == codes.ACL_RT_CNT_NOTIFY_WAIT_EQUAL_MODE:
        return count == value
    if mode == codes.ACL_RT_CNT_NOTIFY_WAIT_BIGGER_MODE:
        return count > value
    if mode == codes.ACL_RT_CNT_NOTIFY_WAIT_BIGGER_OR_EQUAL_MODE:
        return count >= value
    return count & value == value


class CntNotifies:
    """The daemon's count notifies: the ids in use on each device. Thread-safe."""

    def __init__(self, reserves: Reserves | None = None) -> None:
        self._lock = threading.Lock()
        self._ids: dict[int, set[int]] = {}  # device -> ids in use
        self._held: dict[tuple[int, int], int] = {}  # (creator, device) -> its count notifies
        self._reserves = reserves or Reserves()

    def create(self, creator: int, device: int, flags: int) -> CntNotify:
        """aclrtCntNotifyCreate by client `creator` (flag reserved: 0); 207009 past the
        device's count notifies, or the last of them kept for other processes
        (server/core/reserves.py)."""
        if flags != 0:
            raise invalid(f"count notify flag {flags:#x}: it is reserved and must be 0")
        with self._lock:
            ids = self._ids.setdefault(device, set())
            if len(ids) >= MAX_CNT_NOTIFIES_PER_DEVICE:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_NOTIFY_RESOURCE,
                    f"device {device} has its {MAX_CNT_NOTIFIES_PER_DEVICE} count notifies in use",
                )
            held = self._held.get((creator, device), 0)
            reserve = self._reserves.of(
                "cnt_notifies", f"count notifies of device {device}", MAX_CNT_NOTIFIES_PER_DEVICE
            )
            refused = reserve.refuses(held, len(ids))
            if refused is not None:
                raise NpuError(codes.ACL_ERROR_RT_NO_NOTIFY_RESOURCE, refused)
            number = next(n for n in range(len(ids) + 1) if n not in ids)
            ids.add(number)
            self._held[creator, device] = held + 1
        return CntNotify(device, number, creator=creator)

    def release(self, notify: CntNotify) -> None:
        """aclrtCntNotifyDestroy (or its session ended): its id is free again."""
        with self._lock:
            if notify.id in self._ids[notify.device]:
                self._ids[notify.device].discard(notify.id)
                mine = (notify.creator, notify.device)
                self._held[mine] -= 1
                if not self._held[mine]:
                    del self._held[mine]
