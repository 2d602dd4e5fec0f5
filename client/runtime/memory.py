"""rt.memory: device memory -- malloc and free, copies and fills (client/copies.py decides
how each travels), memory info, statistics and limits, IPC sharing, stream-ordered pools,
and the memory helpers aclrtMemsetD32(Async), aclrtFreeWithDevSync, aclrtCheckMemType.

The blocks this process may use are in the allocation index (client/runtime/allocation_index.py),
so that pointers are checked without a round trip. IPC ranges this process imported are
there too (so copies and launches accept them) and in `_imported` (key -> address), and can
only be released with ipc_mem_close. See docs/memory.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from typing import TYPE_CHECKING

from simnpu.client.hostmem import PAGEABLE, PINNED
from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import check_allocatable, wire_int
from simnpu.client.transport import call_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.shm.sizes import parse_size

if TYPE_CHECKING:
    from simnpu.client.copies import CopyPaths
    from simnpu.client.runtime.managed_memory import ManagedMemory
    from simnpu.client.runtime.pinned_memory import PinnedMemory
    from simnpu.client.runtime.shared import Shared
    from simnpu.client.runtime.synchronization import Synchronization

_MEM_ATTRS = range(codes.ACL_DDR_MEM, codes.ACL_MEM_P2P_HUGE1G + 1)
_MEM_TYPES = codes.ACL_RT_MEM_TYPE_DEV | codes.ACL_RT_MEM_TYPE_DVPP | codes.ACL_RT_MEM_TYPE_RSVD
_WORD = struct.Struct("<I")
IPC_KEY_LENGTH = 65
"""The length of the key buffer aclrtIpcMemGetExportKey fills (64 characters and a NUL)."""


def env_memory_limit() -> int:
    """SIMNPU_MEMORY_LIMIT in bytes ('512MiB', '1073741824'); 0 when unset."""
    text = os.environ.get("SIMNPU_MEMORY_LIMIT", "").strip()
    if not text:
        return 0
    try:
        return parse_size(text)
    except ValueError as error:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"SIMNPU_MEMORY_LIMIT: {error}") from None


class DeviceMemory:
    """Device memory calls (see the module docstring)."""

    def __init__(
        self,
        shared: Shared,
        copies: CopyPaths,
        pinned: PinnedMemory,
        managed: ManagedMemory,
        sync: Synchronization,
    ):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._streams = shared.contexts.streams
        self._allocations, self._host = shared.allocations, shared.host
        self._capture_modes = shared.capture_modes
        self.copies = copies  # how each copy and fill travels (client/copies.py)
        self._pinned, self._managed, self._sync = pinned, managed, sync
        # this process as the daemon sees it (0: unverified)
        self._verified_pid = shared.connection.verified_pid
        self._imported: dict[str, int] = {}  # IPC key -> address (also in the index)
        self._imported_counts: dict[str, int] = {}  # IPC key -> imports not yet closed
        self._pools: dict[int, int] = {}  # memory pool -> device
        self._pool_blocks: dict[int, int] = {}  # address -> its pool (also in the index)

    @property
    def uses_shared_memory(self) -> bool:
        """False when the daemon's /dev/shm is out of reach and bytes travel in-stream."""
        return self.copies.shared

    # ---- malloc and free -----------------------------------------------------------------------
    @records_errors
    def malloc(
        self, size: int, policy: int = codes.ACL_MEM_MALLOC_HUGE_FIRST, site: str | None = None
    ) -> int:
        """aclrtMalloc on the current device: a device address (not dereferenceable here).
        Blocks."""
        if not isinstance(size, int) or size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size!r} bytes")
        check_allocatable(size, "device memory", padded=True)
        wire_int(policy, "policy")
        device = self._contexts.current().device
        request = pb.MallocRequest(device=device, size=size, policy=policy)
        address = self._calls.request(request, site).address
        self._allocations.remember(address, size, device)
        return address

    @records_errors
    def free(self, address: int, site: str | None = None) -> None:
        """aclrtFree: returns the block to the pool at once (does not wait for tasks).

        Checked here against this process's allocations, then sent without waiting for the
        daemon (it frees in order with this process's later calls; anything it still refuses
        is reported at the next synchronize)."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free")
        if self._pinned.is_managed(address):
            self._managed.free_managed(address, site)
            return
        with self._allocations.lock:
            if (
                not self._allocations.holds(address)
                or address in self._imported.values()
                or address in self._pool_blocks
            ):
                if address in self._imported.values():
                    raise invalid(
                        f"{address:#x} is imported IPC memory: release it with ipc_mem_close"
                    )
                if address in self._pool_blocks:
                    raise invalid(f"{address:#x} comes from a memory pool: use mem_pool_free_async")
                raise invalid(
                    f"{address:#x} is not the start of a live device allocation of this process"
                    " (double free or bad pointer)"
                )
            self._allocations.forget(address)
        self._calls.post(pb.FreeRequest(address=address), site)

    @records_errors
    def free_with_dev_sync(self, address: int, site: str | None = None) -> None:
        """aclrtFreeWithDevSync: wait for the current device's work, then free. Blocks."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free")
        self._sync.synchronize_device(-1)
        self.free(address, site)

    # ---- copies and fills ----------------------------------------------------------------------
    @records_errors
    def memcpy(
        self, dst: int, dest_max: int, src: int, count: int, kind: int, site: str | None = None
    ) -> None:
        """aclrtMemcpy: synchronous, not ordered with any stream; 107030 where a stream
        capture's mode refuses it. Blocks."""
        self._capture_modes.check("aclrtMemcpy")
        self.copies.copy(None, site or call_site(), dst, dest_max, src, count, kind)

    @records_errors
    def memcpy_async(
        self,
        dst: int,
        dest_max: int,
        src: int,
        count: int,
        kind: int,
        stream: int,
        site: str | None = None,
    ) -> None:
        """aclrtMemcpyAsync: stream-ordered; async from pinned memory, blocking from pageable."""
        if stream not in self._streams:
            stream = self._contexts.stream(stream)
        self.copies.copy(stream, site or call_site(), dst, dest_max, src, count, kind)

    @records_errors
    def memset(
        self, dst: int, dest_max: int, value: int, count: int, site: str | None = None
    ) -> None:
        """aclrtMemset: synchronous byte fill; 107030 where a stream capture's mode refuses
        it. Blocks."""
        self._capture_modes.check("aclrtMemset")
        self.copies.fill(dst, dest_max, value, count, None, site or call_site())

    @records_errors
    def memset_async(
        self, dst: int, dest_max: int, value: int, count: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtMemsetAsync (async for device memory)."""
        stream = self._contexts.stream(stream)
        self.copies.fill(dst, dest_max, value, count, stream, site or call_site())

    @records_errors
    def memset_d32(
        self,
        address: int,
        mem_size: int,
        value: int,
        count: int,
        stream: int | None,
        site: str | None = None,
    ) -> None:
        """aclrtMemsetD32 (stream None; blocks) or aclrtMemsetD32Async: `count` 32-bit words
        of `value`, into memory of aclrtMalloc or aclrtMallocHost only (as the runtime's
        IsAclPinnedMemory check). Device memory is written by a copy of the pattern; pinned
        memory at once (aclrtMemsetD32) or by a task of the stream (the async form)."""
        if count == 0:
            return
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to memset_d32")
        if count < 0 or mem_size < 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "negative size passed to memset_d32")
        if address & 3:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{address:#x} is not 4-byte aligned")
        if mem_size < 4 * count:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"N * 4 ({4 * count}) is greater than memSize ({mem_size})",
            )
        side = self._host.classify(address)
        if side == PAGEABLE:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{address:#x}: only memory allocated by aclrtMalloc or aclrtMallocHost is "
                "supported",
            )
        if not 0 <= value <= 0xFFFFFFFF:
            raise invalid(f"value {value} is not a uint32")
        if stream is not None:
            stream = self._contexts.stream(stream)
        site = site or call_site()
        if side == PINNED:
            self._fill_pinned(address, value, count, stream, site)
            return
        pattern = ctypes.create_string_buffer(_WORD.pack(value) * count, 4 * count)
        self._allocations.device_range(address, 4 * count)
        pattern_at, to_device = ctypes.addressof(pattern), codes.ACL_MEMCPY_HOST_TO_DEVICE
        self.copies.copy(stream, site, address, mem_size, pattern_at, 4 * count, to_device)

    def _fill_pinned(
        self, address: int, value: int, count: int, stream: int | None, site: str
    ) -> None:
        """Words of `value` into pinned memory: at once without a stream, or when a client's
        pinned memory is its own (in-stream mode: no task can touch it); else in stream order."""
        block = self._host.find(address)
        assert block is not None, "classified as pinned"
        if address + 4 * count > block.address + block.size:
            raise invalid(
                f"{4 * count} bytes at {address:#x} run past the end of pinned memory "
                f"[{block.address:#x}, +{block.size})"
            )
        if stream is None or not self.copies.shared:
            ctypes.memmove(address, _WORD.pack(value) * count, 4 * count)
            return
        dst = commands.Location(commands.SPACE_PINNED, block.handle, address - block.address)
        self._calls.command(commands.MemsetD32.pack(stream, dst, value, count), stream, site)

    @records_errors
    def check_mem_type(self, addresses: list[int], mem_type: int, reserve: int) -> int:
        """aclrtCheckMemType: 1 if every address lies in device memory of this process and
        `mem_type` names device memory (ACL_RT_MEM_TYPE_DEV or _DVPP: one pool here), else 0."""
        if reserve != 0:
            raise invalid(f"reserve must be 0, not {reserve}")
        if not addresses:
            raise invalid("the address list is empty")
        if not mem_type or mem_type & ~_MEM_TYPES:
            raise invalid(f"memType {mem_type:#x}: use ACL_RT_MEM_TYPE_DEV, _DVPP, _RSVD")
        if not mem_type & (codes.ACL_RT_MEM_TYPE_DEV | codes.ACL_RT_MEM_TYPE_DVPP):
            return 0
        for address in addresses:
            try:
                self._allocations.device_range(address, 1)
            except NpuError:
                return 0
        return 1

    # ---- information and limits ------------------------------------------------------------
    @records_errors
    def get_mem_info(
        self, attr: int = codes.ACL_HBM_MEM, site: str | None = None
    ) -> tuple[int, int]:
        """aclrtGetMemInfo: (free, total) bytes of the current device's memory. Under a memory
        limit, total is the limit and free what is left of it. Blocks."""
        if attr not in _MEM_ATTRS:
            raise invalid(f"unknown memory attribute {attr}")
        request = pb.GetMemInfoRequest(device=self._contexts.current().device)
        reply = self._calls.request(request, site)
        return reply.free, reply.total

    def _device_or_current(self, device: int | None) -> int:
        device = self._contexts.current().device if device is None else device
        self._contexts.check_device(device)
        return device

    @records_errors
    def memory_stats(self, device: int | None = None, site: str | None = None) -> dict:
        """The device pool's statistics (torch.cuda.memory_stats key names; docs/memory.md).
        Blocks."""
        device = self._device_or_current(device)
        return json.loads(self._calls.request(pb.MemoryStatsRequest(device=device), site).json)

    @records_errors
    def memory_snapshot(self, device: int | None = None, site: str | None = None) -> list[dict]:
        """The device's live blocks in address order, each with its owner (every client's).
        Blocks."""
        device = self._device_or_current(device)
        return json.loads(self._calls.request(pb.MemorySnapshotRequest(device=device), site).json)

    @records_errors
    def set_memory_limit(
        self, limit: int, device: int | None = None, site: str | None = None
    ) -> None:
        """Lower this process's device-memory limit (bytes; 0 restores the daemon's default)
        on `device`, or on every device when None. A limit above the daemon's default is
        refused (107000). Blocks."""
        if not isinstance(limit, int) or limit < 0:
            raise invalid(f"a memory limit must be a byte count >= 0, not {limit!r}")
        wire_int(limit, "limit")
        if device is not None:
            self._contexts.check_device(device)
        self._calls.request(pb.MemoryLimitRequest(device=device, limit=limit), site)

    @records_errors
    def memory_limit(
        self, device: int | None = None, site: str | None = None
    ) -> tuple[int | None, int, int | None]:
        """(limit in force or None, bytes this process holds, the daemon's default or None)
        on `device` (default: the current one). Blocks."""
        device = self._device_or_current(device)
        reply = self._calls.request(pb.MemoryLimitRequest(device=device), site)
        return reply.limit or None, reply.used, reply.default or None

    # ---- IPC memory ----------------------------------------------------------------------------
    @records_errors
    def device_get_bare_tgid(self) -> int:
        """aclrtDeviceGetBareTgid: the process id an exporter whitelists: this process's pid as
        the daemon sees it (its pid namespace), verified through the credentials socket; 0
        when it could not be (TCP, no credentials socket, a process the daemon cannot see),
        and such a process imports only keys exported without pid validation."""
        return self._verified_pid

    @records_errors
    def ipc_mem_get_export_key(
        self, address: int, size: int, flags: int = 0, site: str | None = None
    ) -> str:
        """aclrtIpcMemGetExportKey: a key that lets other processes import [address, address+size)
        of one of this process's allocations. flags: 0 = only whitelisted pids may import,
        1 (ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION) = any process. Blocks."""
        if not address:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to ipc_mem_get_export_key"
            )
        if not isinstance(size, int) or size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot share {size!r} bytes")
        if address in self._imported.values():
            raise invalid(f"{address:#x} is imported IPC memory; only its owner can export it")
        self._allocations.device_range(address, size)
        wire_int(flags, "flags")
        request = pb.IpcMemExportRequest(address=address, size=size, flags=flags)
        return self._calls.request(request, site).key

    @records_errors
    def ipc_mem_set_import_pid(self, key: str, pids, site: str | None = None) -> None:
        """aclrtIpcMemSetImportPid: whitelist processes (their device_get_bare_tgid) for `key`.
        Blocks."""
        pids = [wire_int(int(pid), "pid") for pid in pids]
        if not key or not pids:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, "ipc_mem_set_import_pid needs a key and pids"
            )
        self._calls.request(pb.IpcMemSetImportPidRequest(key=_key(key), pids=pids), site)

    @records_errors
    def ipc_mem_import_by_key(self, key: str, flags: int = 0, site: str | None = None) -> int:
        """aclrtIpcMemImportByKey: the device address of the memory exported under `key`,
        usable here like this process's own until ipc_mem_close(key). Blocks."""
        if not key:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "empty IPC key")
        key = _key(key)
        wire_int(flags, "flags")
        reply = self._calls.request(pb.IpcMemImportRequest(key=key, flags=flags), site)
        with self._allocations.lock:
            self._imported_counts[key] = self._imported_counts.get(key, 0) + 1
            first = key not in self._imported
            if first:
                self._imported[key] = reply.address
        if first:
            self._allocations.remember(reply.address, reply.size, reply.device)
        return reply.address

    @records_errors
    def ipc_mem_close(self, key: str, site: str | None = None) -> None:
        """aclrtIpcMemClose: an importer stops using the key's memory; the exporter closes
        the key (after every importer has). Blocks."""
        if not key:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "empty IPC key")
        key = _key(key)
        self._calls.request(pb.IpcMemCloseRequest(key=key), site)
        with self._allocations.lock:
            count = self._imported_counts.get(key, 0) - 1
            if count > 0:
                self._imported_counts[key] = count
            elif key in self._imported:
                del self._imported_counts[key]
                address = self._imported.pop(key)
                if address not in self._imported.values() and self._allocations.holds(address):
                    self._allocations.forget(address)

    # ---- stream-ordered pools ------------------------------------------------------------------
    def _pool(self, pool: int) -> int:
        if pool not in self._pools:
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_HANDLE,
                f"memory pool {pool!r} is not valid in this process",
            )
        return pool

    @records_errors
    def mem_pool_create(
        self, max_size: int = 0, device: int | None = None, site: str | None = None
    ) -> int:
        """aclrtMemPoolCreate: a stream-ordered pool on `device` (default: the current one);
        `max_size` (props.maxSize) caps it, 0 = no cap but the memory limit. Blocks."""
        device = self._device_or_current(device)
        if not isinstance(max_size, int) or max_size < 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"maxSize must be a byte count >= 0, not {max_size!r}",
            )
        wire_int(max_size, "maxSize")
        request = pb.MemPoolCreateRequest(device=device, max_size=max_size)
        pool = self._calls.request(request, site).pool
        self._pools[pool] = device
        return pool

    @records_errors
    def mem_pool_destroy(self, pool: int, site: str | None = None) -> None:
        """aclrtMemPoolDestroy: blocks still allocated from the pool are freed. Blocks."""
        self._calls.request(pb.MemPoolDestroyRequest(pool=self._pool(pool)), site)
        with self._allocations.lock:
            for address in [a for a, p in self._pool_blocks.items() if p == pool]:
                del self._pool_blocks[address]
                if self._allocations.holds(address):
                    self._allocations.forget(address)
            del self._pools[pool]

    @records_errors
    def mem_pool_malloc_async(
        self, size: int, pool: int, stream: int, site: str | None = None
    ) -> int:
        """aclrtMemPoolMallocAsync: a block usable by work queued on `stream` (or any stream)
        from now on. Returns the address (blocks for it; no stream synchronisation)."""
        if not isinstance(size, int) or size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size!r} bytes")
        check_allocatable(size, "memory pool memory")
        request = pb.MemPoolMallocRequest(
            pool=self._pool(pool), size=size, stream=self._contexts.stream(stream)
        )
        address = self._calls.request(request, site).address
        self._allocations.remember(address, size, self._pools[pool])
        self._pool_blocks[address] = pool
        return address

    @records_errors
    def mem_pool_free_async(self, address: int, stream: int, site: str | None = None) -> None:
        """aclrtMemPoolFreeAsync (async): the block returns to the device once `stream` has
        run everything queued on it before this call."""
        stream = self._contexts.stream(stream)
        with self._allocations.lock:
            if self._pool_blocks.pop(address, None) is None:
                raise invalid(f"{address:#x} is not a live block of a memory pool of this process")
            self._allocations.forget(address)
        self._calls.post(pb.MemPoolFreeRequest(address=address, stream=stream), site)

    @records_errors
    def mem_pool_set_attr(self, pool: int, attr: int, value: int, site: str | None = None) -> None:
        """aclrtMemPoolSetAttr: release threshold and reuse flags (stored; simnpu's pools do
        not cache), or a high-water attribute reset to 0. Blocks."""
        if not isinstance(value, int) or value < 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"attribute value must be an int >= 0, not {value!r}"
            )
        wire_int(attr, "attr")
        wire_int(value, "value")
        request = pb.MemPoolSetAttrRequest(pool=self._pool(pool), attr=attr, value=value)
        self._calls.request(request, site)

    @records_errors
    def mem_pool_get_attr(self, pool: int, attr: int, site: str | None = None) -> int:
        """aclrtMemPoolGetAttr (used/reserved current and high-water bytes, and the settable ones).
        Blocks."""
        wire_int(attr, "attr")
        request = pb.MemPoolGetAttrRequest(pool=self._pool(pool), attr=attr)
        return self._calls.request(request, site).value

    @records_errors
    def mem_pool_trim_to(self, pool: int, keep: int, site: str | None = None) -> None:
        """aclrtMemPoolTrimTo: release the pool's unused reserved memory beyond `keep` bytes
        (a simnpu pool keeps none: freed blocks go back to the device at once). Blocks."""
        wire_int(keep, "minBytesToKeep")
        request = pb.MemPoolTrimToRequest(pool=self._pool(pool), min_bytes_to_keep=keep)
        self._calls.request(request, site)


def _key(key) -> str:
    """An IPC key as given by the caller (str, bytes, or a NUL-terminated buffer)."""
    if isinstance(key, (bytes, bytearray)):
        key = bytes(key).split(b"\0", 1)[0].decode("ascii", "replace")
    key = str(key).split("\0", 1)[0]
    if len(key) >= IPC_KEY_LENGTH:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM, f"an IPC key has at most {IPC_KEY_LENGTH - 1} characters"
        )
    return key
