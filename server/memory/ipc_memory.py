"""IPC memory: one device buffer used by two host processes (aclrtIpcMem*).

ACL's protocol (the CANN runtime's API reference, docs/zh/api_ref/11-07_IPC_memory_sharing.md
of https://gitcode.com/cann/runtime), as simnpu runs it:

    exporter A                              importer B
    p = aclrtMalloc(...)
    key = aclrtIpcMemGetExportKey(p, n, flags)
    aclrtIpcMemSetImportPid(key, [pid of B])   (unless flags = DISABLE_PID_VALIDATION)
                                            q = aclrtIpcMemImportByKey(key)   (q == p here)
                                            ... copies, kernels on [q, q + n) ...
                                            aclrtIpcMemClose(key)
    aclrtIpcMemClose(key)
    aclrtFree(p)

- A key names `[p, p + n)` inside one of the exporter's allocations. The importer gets the
  same device address (the simulated address space is shared by all processes) and may
  use the range like its own memory; it is still charged to the exporter.
- Without DISABLE_PID_VALIDATION only whitelisted pids may import (207006 otherwise). The
  pid is the one the daemon verified (server/control/credentials.py: SO_PEERCRED through the
  credentials socket), never the one a client claims; a client it could not verify (TCP, or no
  credentials socket) has pid 0, which no whitelist holds: it imports only keys exported
  with DISABLE_PID_VALIDATION.
- A key is shown only to its exporter (the snapshot shows others how many keys a block has).
- Every import is paired with a close in the importing process; the exporter closes last.
- Out of order (ACL: "otherwise exceptions may occur"), simnpu keeps every importer safe
  and says what happened in the daemon log: an exporter's close while importers hold the
  key stops new imports only; an exporter's aclrtFree (or exit) while importers hold the
  key returns the pointer to nobody: the block stays allocated, still the exporter's,
  until the last importer closes, and only then goes back to the pool. Importing a key
  whose memory was freed, or that its exporter closed, fails (107000), as ACL requires the
  memory to exist at import.
- When a process ends, its imports are closed and its allocations freed by these rules.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
from dataclasses import dataclass, field

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.rate_limits import log_about

log = logging.getLogger("simnpu.ipc")

KEY_LENGTH = 65
"""The key buffer ACL's aclrtIpcMemGetExportKey fills (64 characters and a NUL)."""

EXPORT_FLAG_DEFAULT = 0x0
EXPORT_FLAG_DISABLE_PID_VALIDATION = 0x1
IMPORT_FLAG_DEFAULT = 0x0
IMPORT_FLAG_ENABLE_PEER_ACCESS = 0x1


@dataclass(eq=False)
class Export:
    key: str
    device: int
    address: int  # the shared range [address, address + size)
    size: int
    block: int  # device address of the allocation holding it
    exporter: object  # the exporting client (its Owner)
    validate_pids: bool
    pids: set = field(default_factory=set)
    importers: dict = field(default_factory=dict)  # importing client (Owner) -> open imports
    exporter_closed: bool = False


class IpcMemory:
    """The daemon's table of exported keys. Thread-safe (sessions call it from their readers)."""

    def __init__(self, devices: list):
        self._devices = devices
        self._lock = threading.Lock()
        self._exports: dict[str, Export] = {}
        self._by_block: dict[int, list[Export]] = {}  # block address -> its exports
        self._held: dict[int, int] = {}  # freed by its owner, kept for importers
        self._numbers = itertools.count(1)

    # ---- the four ACL calls ---------------------------------------------------------------
    def export(
        self, session, address: int, size: int, flags: int, block: tuple[int, int], device: int
    ) -> str:
        """aclrtIpcMemGetExportKey: `block` is (start, size) of the exporter's allocation."""
        if flags not in (EXPORT_FLAG_DEFAULT, EXPORT_FLAG_DISABLE_PID_VALIDATION):
            raise invalid(f"unknown IPC export flags {flags:#x}")
        if size <= 0:
            raise invalid(f"cannot share {size} bytes")
        start, length = block
        if address + size > start + length:
            raise invalid(
                f"{size} bytes at {address:#x} run past the end of the allocation "
                f"[{start:#x}, +{length})"
            )
        with self._lock:
            key = f"simnpu-ipc-{os.getpid()}-{next(self._numbers)}-{secrets.token_hex(8)}"
            export = Export(
                key,
                device,
                address,
                size,
                start,
                session,
                flags != EXPORT_FLAG_DISABLE_PID_VALIDATION,
            )
            self._exports[key] = export
            self._by_block.setdefault(start, []).append(export)
        return key

    def set_import_pid(self, session, key: str, pids: list[int]) -> None:
        """aclrtIpcMemSetImportPid: the pids (aclrtDeviceGetBareTgid) allowed to import."""
        if not pids:
            raise invalid("aclrtIpcMemSetImportPid needs at least one pid")
        if any(pid <= 0 for pid in pids):
            raise invalid(f"not a process id in {pids}")
        with self._lock:
            export = self._exports.get(key)
            if export is None or export.exporter is not session:
                raise invalid(f"{key!r} is not an IPC key exported by this process")
            export.pids.update(pids)

    def import_(self, session, key: str, flags: int, pid: int) -> Export:
        """aclrtIpcMemImportByKey: the export, now also open in `session`, whose verified pid
        is `pid` (0: not verified)."""
        if flags not in (IMPORT_FLAG_DEFAULT, IMPORT_FLAG_ENABLE_PEER_ACCESS):
            raise invalid(f"unknown IPC import flags {flags:#x}")
        with self._lock:
            export = self._exports.get(key)
            if export is None:
                raise invalid(
                    f"no IPC memory is exported under {key!r} (its memory was freed, "
                    "its exporter closed it or ended, or the key is wrong)"
                )
            if export.exporter is session:
                raise invalid(f"{key!r} was exported by this process: use the pointer itself")
            if export.validate_pids and not pid:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_PERMISSION,
                    f"{session!r} cannot import {key!r}: the daemon could not verify this "
                    "process's pid (it connected over TCP, without the credentials socket "
                    "beside the daemon's Unix socket, or from a pid namespace the daemon "
                    "cannot see), so no pid whitelist admits it; the exporter may export "
                    "with ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION",
                )
            if export.validate_pids and pid not in export.pids:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_PERMISSION,
                    f"{session!r} (verified pid {pid}) is not on the import whitelist of "
                    f"{key!r} (the exporter {export.exporter!r} allows pids "
                    f"{sorted(export.pids) or 'none yet'}; see aclrtIpcMemSetImportPid)",
                )
            export.importers[session] = export.importers.get(session, 0) + 1
            return export

    def close(self, session, key: str) -> Export | None:
        """aclrtIpcMemClose in `session`; returns the export when `session` closed an import of
        it for the last time (the caller forgets the imported range)."""
        with self._lock:
            export = self._exports.get(key)
            if export is None:
                export = self._find_closed_import(session, key)
            if export is None:
                raise invalid(f"{key!r} is not an IPC key open in this process")
            if session in export.importers:
                left = export.importers[session] - 1
                if left:
                    export.importers[session] = left
                    return None
                del export.importers[session]
                self._forget_if_done(export)
                return export
            if export.exporter is session and not export.exporter_closed:
                export.exporter_closed = True
                if export.importers:
                    log_about(
                        session,
                        log,
                        logging.WARNING,
                        "%r closed IPC key %s while %s still hold it: ACL wants importers to "
                        "close first; their imports stay valid",
                        session,
                        key,
                        ", ".join(map(repr, export.importers)),
                    )
                self._exports.pop(key, None)
                self._forget_if_done(export)
                return None
            raise invalid(f"{key!r} is not an IPC key open in this process")

    # ---- frees and session ends ------------------------------------------------------------
    def owner_frees(self, session, block: int) -> bool:
        """The owner frees the allocation at `block`: True if importers still hold part of it
        (the block is then kept, and freed by the last importer's close)."""
        with self._lock:
            exports = self._by_block.get(block)
            if not exports:
                return False
            holders: set[object] = set()  # importing clients (Owners)
            for export in exports:
                self._exports.pop(export.key, None)
                export.exporter_closed = True
                holders.update(export.importers)
            if not holders:
                del self._by_block[block]
                return False
            self._held[block] = exports[0].device
            log_about(
                session,
                log,
                logging.WARNING,
                "%r freed the memory at %#x while %s still hold it through IPC: it is "
                "released when they close it",
                session,
                block,
                ", ".join(map(repr, holders)),
            )
            return True

    def session_ended(self, session, imported_keys: list[str]) -> None:
        """Close every import `session` still had open."""
        for key in imported_keys:
            with self._lock:
                export = self._exports.get(key) or self._find_closed_import(session, key)
                if export is None or session not in export.importers:
                    continue
                del export.importers[session]
                self._forget_if_done(export)

    def describe(self, block: int, viewer: object = None) -> dict | None:
        """What the snapshot shows of a block's sharing to `viewer` (an Owner; None: a tool
        without a session): how many keys are open, and the keys themselves only to their
        exporter."""
        with self._lock:
            exports = self._by_block.get(block)
            if not exports:
                return None
            keys = [e.key for e in exports if not e.exporter_closed]
            return {
                "key_count": len(keys),
                "keys": keys if viewer is not None and exports[0].exporter is viewer else [],
                "importers": sorted({repr(s) for e in exports for s in e.importers}),
                "held_after_free": block in self._held,
            }

    def imports_of(self, session) -> list[tuple[Export, int, bool]]:
        """What `session` imported and has not closed: (export, open imports of it, whether
        its exporter freed the block, which is then kept for the importers)."""
        with self._lock:
            return [
                (export, export.importers[session], export.block in self._held)
                for exports in self._by_block.values()
                for export in exports
                if session in export.importers
            ]

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "ipc.exported_keys": len(self._exports),
                "ipc.open_imports": sum(
                    sum(e.importers.values()) for es in self._by_block.values() for e in es
                ),
                "ipc.held_blocks": len(self._held),
            }

    # ---- inside the lock ---------------------------------------------------------------------
    def _find_closed_import(self, session, key: str) -> Export | None:
        for exports in self._by_block.values():
            for export in exports:
                if export.key == key and session in export.importers:
                    return export
        return None

    def _forget_if_done(self, export: Export) -> None:
        """Drop a closed export nobody imports any more; free its block if it was held."""
        if export.importers or not export.exporter_closed:
            return
        exports = self._by_block.get(export.block, [])
        if export in exports:
            exports.remove(export)
        if any(e.importers for e in exports):
            return
        if export.block in self._held:
            device = self._held.pop(export.block)
            self._by_block.pop(export.block, None)
            self._devices[device].free(export.block)
        elif not exports:
            self._by_block.pop(export.block, None)
