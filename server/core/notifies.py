"""Notifies: a flag on a device that one stream sets (aclrtRecordNotify) and another stream
waits for and clears (aclrtWaitAndResetNotify), within one process or, exported by key,
between processes (aclrtNotifyGetExportKey / aclrtNotifySetImportPid /
aclrtNotifyImportByKey; the CANN runtime's API reference, 08_notify_management.md).

Unlike an event's wait, a notify's wait does not bind to a record made before it: it holds
its stream until the flag is set, whenever that happens, and clears it; records while the
flag is set change nothing (it is one flag, not a count).

An exported notify may be imported only by whitelisted processes, the pids the daemon
verified (as for IPC memory: server/memory/ipc_memory.py, docs/security.md), unless it was exported
with ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION. Every process that holds a notify
destroys it (or ends); it is gone when the last one has.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.reserves import Reserves

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.streams import Stream

MAX_NOTIFIES_PER_DEVICE = 8192
"""Notifies one device has for all its clients (Atlas A2/A3 training parts)."""

CREATE_FLAGS = (codes.ACL_NOTIFY_DEFAULT, codes.ACL_NOTIFY_DEVICE_USE_ONLY)
EXPORT_FLAGS = (
    codes.ACL_RT_NOTIFY_EXPORT_FLAG_DEFAULT,
    codes.ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION,
)
IMPORT_FLAGS = (
    codes.ACL_RT_NOTIFY_IMPORT_FLAG_DEFAULT,
    codes.ACL_RT_NOTIFY_IMPORT_FLAG_ENABLE_PEER_ACCESS,
)


@dataclass(eq=False)
class Notify:
    device: int
    creator: Owner
    flags: int
    is_set: bool = False  # recorded and not cleared by a wait since
    waiting: list[Stream] = field(default_factory=list)  # streams whose head waits for it
    holders: int = 1  # handles to it in all sessions (its creator's and importers')
    key: str | None = None  # its export key, once exported
    validate_pids: bool = True
    pids: set[int] = field(default_factory=set)


class Notifies:
    """The daemon's notifies: how many each device has, and the exported ones by key.
    Thread-safe (sessions call it from their own threads)."""

    def __init__(self, reserves: Reserves | None = None) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}  # device -> its notifies
        self._held: dict[tuple[int, int], int] = {}  # (creator's id, device) -> its notifies
        self._reserves = reserves or Reserves()
        self._exports: dict[str, Notify] = {}
        self._numbers = itertools.count(1)

    def create(self, owner: Owner, device: int, flags: int) -> Notify:
        """aclrtCreateNotify; 207009 past the device's notifies, or the last of them kept
        for other processes (server/core/reserves.py)."""
        if flags not in CREATE_FLAGS:
            raise invalid(f"notify flags {flags:#x}: use ACL_NOTIFY_DEFAULT or _DEVICE_USE_ONLY")
        with self._lock:
            in_use = self._counts.get(device, 0)
            if in_use >= MAX_NOTIFIES_PER_DEVICE:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_NOTIFY_RESOURCE,
                    f"device {device} has its {MAX_NOTIFIES_PER_DEVICE} notifies in use",
                )
            held = self._held.get((owner.id, device), 0)
            reserve = self._reserves.of(
                "notifies", f"notifies of device {device}", MAX_NOTIFIES_PER_DEVICE
            )
            refused = reserve.refuses(held, in_use)
            if refused is not None:
                raise NpuError(codes.ACL_ERROR_RT_NO_NOTIFY_RESOURCE, refused)
            self._counts[device] = in_use + 1
            self._held[owner.id, device] = held + 1
        return Notify(device, owner, flags)

    def release(self, notify: Notify) -> None:
        """A holder destroyed it (or ended): the last one frees it."""
        with self._lock:
            notify.holders -= 1
            if notify.holders == 0:
                self._counts[notify.device] -= 1
                mine = (notify.creator.id, notify.device)
                self._held[mine] -= 1
                if not self._held[mine]:
                    del self._held[mine]
                if notify.key is not None:
                    self._exports.pop(notify.key, None)

    def export(self, owner: Owner, notify: Notify, flags: int) -> str:
        """aclrtNotifyGetExportKey of a notify `owner` created."""
        if flags not in EXPORT_FLAGS:
            raise invalid(f"unknown notify export flags {flags:#x}")
        if notify.creator is not owner:
            raise invalid("an imported notify cannot be exported again")
        with self._lock:
            if notify.key is None:
                notify.key = (
                    f"simnpu-notify-{os.getpid()}-{next(self._numbers)}-{secrets.token_hex(8)}"
                )
                self._exports[notify.key] = notify
            notify.validate_pids = flags != codes.ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION
            return notify.key

    def set_import_pid(self, owner: Owner, notify: Notify, pids: list[int]) -> None:
        """aclrtNotifySetImportPid: the pids (aclrtDeviceGetBareTgid) allowed to import it."""
        if not pids:
            raise invalid("aclrtNotifySetImportPid needs at least one pid")
        if any(pid <= 0 for pid in pids):
            raise invalid(f"not a process id in {pids}")
        if notify.creator is not owner or notify.key is None:
            raise invalid("the notify was not exported by this process (aclrtNotifyGetExportKey)")
        with self._lock:
            notify.pids.update(pids)

    def import_(self, owner: Owner, key: str, flags: int, pid: int) -> Notify:
        """aclrtNotifyImportByKey by `owner`, whose verified pid is `pid` (0: not verified)."""
        if flags not in IMPORT_FLAGS:
            raise invalid(f"unknown notify import flags {flags:#x}")
        with self._lock:
            notify = self._exports.get(key)
            if notify is None:
                raise invalid(f"no notify is exported under {key!r} (destroyed, or a wrong key)")
            if notify.creator is owner:
                raise invalid(f"{key!r} was exported by this process: use the notify itself")
            if notify.validate_pids and (not pid or pid not in notify.pids):
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_PERMISSION,
                    f"{owner!r} (verified pid {pid or 'none'}) is not on the import whitelist "
                    f"of {key!r} (see aclrtNotifySetImportPid, or export it with "
                    "ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION)",
                )
            notify.holders += 1
            return notify
