"""The raw layer's calls that share physical memory between processes of one daemon
(aclrtMemExportToShareableHandle, aclrtMemSetPidToShareableHandle,
aclrtMemImportFromShareableHandle and their V2 forms; server/shareable_memory.py).

A mixin of `Runtime` (client/runtime.py); an imported handle joins the physical handles of
client/runtime_vmm.py and is mapped, freed and asked about like one this process allocated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import wire_int
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    import threading

    from google.protobuf.message import Message

    from simnpu.client.runtime import ContextInfo


def _param(message: str) -> NpuError:
    """ACL's own parameter check failed (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, message)


def _share_type(share_type: int) -> None:
    """The V2 calls' aclrtMemSharedHandleType: DEFAULT (a 64-bit number) only."""
    if share_type == codes.ACL_MEM_SHARE_HANDLE_TYPE_FABRIC:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "fabric handles (sharing between servers) are not simulated: the daemon serves "
            "one host (use ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT)",
        )
    if share_type != codes.ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT:
        raise invalid(f"share type {share_type} does not exist")


class RuntimeShareableMemory:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    _lock: threading.Lock
    physical: dict[int, list[int]]  # handle -> [size, device, mem_attr, references]

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def _check_device(self, device: int) -> None: ...
        def _physical(self, handle: int) -> list[int]: ...

    @records_errors
    def mem_export_to_shareable_handle(self, handle: int, handle_type: int, flags: int) -> int:
        """aclrtMemExportToShareableHandle: the shareable handle of physical memory this
        process allocated, for other processes of the daemon. flags: 0 (only pids set with
        mem_set_pid_to_shareable_handle import) or ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION
        (1). Blocks."""
        if not handle:
            raise _param("null handle passed to mem_export_to_shareable_handle")
        if handle_type != codes.ACL_MEM_HANDLE_TYPE_NONE:
            raise _param("handle_type must be ACL_MEM_HANDLE_TYPE_NONE (0)")
        self._physical(handle)
        wire_int(flags, "flags")
        return self._call(pb.ExportShareableRequest(handle=handle, flags=flags)).shareable

    @records_errors
    def mem_export_to_shareable_handle_v2(self, handle: int, flags: int, share_type: int) -> int:
        """aclrtMemExportToShareableHandleV2 (DEFAULT share type: a 64-bit number). Blocks."""
        if not handle:
            raise _param("null handle passed to mem_export_to_shareable_handle_v2")
        _share_type(share_type)
        self._physical(handle)
        wire_int(flags, "flags")
        return self._call(pb.ExportShareableRequest(handle=handle, flags=flags)).shareable

    @records_errors
    def mem_set_pid_to_shareable_handle(self, shareable: int, pids: list[int]) -> None:
        """aclrtMemSetPidToShareableHandle: whitelist processes (their
        device_get_bare_tgid) for `shareable`. Blocks."""
        if not pids:
            raise _param("mem_set_pid_to_shareable_handle needs at least one pid")
        pids = [wire_int(pid, "pid") for pid in pids]
        self._call(pb.SetShareablePidsRequest(shareable=shareable, pids=pids))

    @records_errors
    def mem_set_pid_to_shareable_handle_v2(
        self, shareable: int, share_type: int, pids: list[int]
    ) -> None:
        """aclrtMemSetPidToShareableHandleV2. Blocks."""
        if not shareable or not pids:
            raise _param("mem_set_pid_to_shareable_handle_v2 needs a handle and pids")
        _share_type(share_type)
        pids = [wire_int(pid, "pid") for pid in pids]
        self._call(pb.SetShareablePidsRequest(shareable=shareable, pids=pids))

    @records_errors
    def mem_import_from_shareable_handle(self, shareable: int, device: int) -> int:
        """aclrtMemImportFromShareableHandle: this process's handle of the physical memory
        another process exported, for `device` (the memory's own). Blocks."""
        self._check_device(device)
        return self._import(shareable, device)

    @records_errors
    def mem_import_from_shareable_handle_v2(
        self, shareable: int, share_type: int, flags: int
    ) -> int:
        """aclrtMemImportFromShareableHandleV2, for the current device. Blocks."""
        if not shareable:
            raise _param("null shareable handle passed to mem_import_from_shareable_handle_v2")
        if flags:
            raise _param(f"flags {flags}: must be 0")
        _share_type(share_type)
        return self._import(shareable, self._current().device)

    def _import(self, shareable: int, device: int) -> int:
        reply = self._call(pb.ImportShareableRequest(shareable=shareable, device=device))
        with self._lock:
            self.physical[reply.handle] = [reply.size, reply.device, reply.mem_attr, 1]
        return reply.handle
