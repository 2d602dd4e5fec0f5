"""Physical memory shared between processes of one daemon (aclrtMemExportToShareableHandle,
aclrtMemSetPidToShareableHandle, aclrtMemImportFromShareableHandle and their V2 forms).

ACL's protocol, as simnpu runs it (docs/device-memory.md):

    exporter A                                   importer B
    h = aclrtMallocPhysical(...)
    s = aclrtMemExportToShareableHandle(h, flags)
    aclrtMemSetPidToShareableHandle(s, [pid of B])   (unless flags = DISABLE_PID_VALIDATION)
                                                 h2 = aclrtMemImportFromShareableHandle(s)
                                                 aclrtMapMem(..., h2) ... aclrtFreePhysical(h2)
    aclrtFreePhysical(h)

- A shareable handle is a number naming one physical allocation; one per handle (a second
  export of the same handle is 107000). It is valid while its exporter holds the handle:
  once the exporter frees it (or ends), new imports fail (107000); imports made before
  keep the memory until their last free and unmap, as ACL says.
- The whitelist is IPC memory's (server/memory/ipc_memory.py): without DISABLE_PID_VALIDATION only
  pids the exporter set may import, the pid the daemon verified, never one a client claims
  (207006 otherwise).
- The importer's handle is the same physical block: its memory, pages and device; the
  block stays charged to the exporter.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.memory.virtual_memory import Physical

EXPORT_FLAG_DISABLE_PID_VALIDATION = 0x1


@dataclass(eq=False)
class Shared:
    number: int  # the shareable handle
    physical: Physical
    exporter: object  # the exporting client (its Owner)
    validate_pids: bool
    pids: set[int] = field(default_factory=set)


class ShareableMemory:
    """The daemon's table of shareable handles. Thread-safe (sessions call it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared: dict[int, Shared] = {}

    def export(self, exporter: object, physical: Physical, flags: int) -> int:
        """aclrtMemExportToShareableHandle(V2): the shareable handle of `physical`."""
        if flags not in (0, EXPORT_FLAG_DISABLE_PID_VALIDATION):
            raise invalid(f"export flags {flags:#x} are not in [0, 1]")
        with self._lock:
            if any(shared.physical is physical for shared in self._shared.values()):
                raise invalid("this physical memory handle was exported already")
            number = secrets.randbits(62) + 1
            self._shared[number] = Shared(number, physical, exporter, not flags)
        return number

    def set_pids(self, exporter: object, number: int, pids: list[int]) -> None:
        """aclrtMemSetPidToShareableHandle(V2): the pids allowed to import `number`."""
        if any(pid <= 0 for pid in pids):
            raise invalid(f"not a process id in {pids}")
        with self._lock:
            shared = self._shared.get(number)
            if shared is None or shared.exporter is not exporter:
                raise invalid(f"{number:#x} is not a shareable handle this process exported")
            shared.pids.update(pids)

    def import_(self, importer: object, number: int, pid: int) -> Physical:
        """aclrtMemImportFromShareableHandle(V2) by `importer`, whose verified pid is `pid`
        (0: not verified): the physical memory (the caller takes a reference)."""
        with self._lock:
            shared = self._shared.get(number)
            if shared is None:
                raise invalid(
                    f"{number:#x} is not a shareable handle (its exporter freed the memory "
                    "or ended, or the number is wrong)"
                )
            if shared.exporter is importer:
                raise invalid(f"{number:#x} was exported by this process: use its handle")
            if shared.validate_pids and pid not in shared.pids:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_PERMISSION,
                    f"{importer!r} (verified pid {pid or 'none'}) is not on the whitelist of "
                    f"shareable handle {number:#x} (see aclrtMemSetPidToShareableHandle, or "
                    "export with ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION)",
                )
            return shared.physical

    def let_go(self, exporter: object, physical: Physical | None = None) -> None:
        """The exporter no longer holds `physical` (every physical memory of it if None):
        its shareable handle ends."""
        with self._lock:
            for number, shared in list(self._shared.items()):
                if shared.exporter is exporter and physical in (None, shared.physical):
                    del self._shared[number]
