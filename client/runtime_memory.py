"""The raw layer's device-memory calls beyond malloc: free, memory info and limits, pool
statistics and snapshot, IPC sharing, stream-ordered pools.

A mixin of `Runtime` (client/runtime.py), which owns the host-side table of this process's
device memory (`allocations`: address -> (size, device), `allocation_starts`: sorted), used
to check pointers without a round trip. IPC ranges this process imported are in that table
too (so copies and launches accept them) and in `imported` (key -> address), and can only
be released with ipc_mem_close. See docs/memory.md.
"""

from __future__ import annotations

import bisect
import json
import os
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.transport import caller_site
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, NpuMemoryError, invalid
from simnpu.shm.sizes import parse_size

if TYPE_CHECKING:
    import threading

    from google.protobuf.message import Message

    from simnpu.client.runtime import ContextInfo
    from simnpu.client.transport import Connection

_MEM_ATTRS = range(codes.ACL_DDR_MEM, codes.ACL_MEM_P2P_HUGE1G + 1)
IPC_KEY_LENGTH = 65
"""The length of the key buffer aclrtIpcMemGetExportKey fills (64 characters and a NUL)."""
INT64_MAX = (1 << 63) - 1
_SIZE_T_END = 1 << 64
_ACL_MALLOC_PAD = 64  # aclrtMalloc adds 32 bytes of alignment and 32 of padding to a size


def wire_int(value: int, name: str) -> int:
    """`value`, checked to fit the int64 the daemon is told it in: else 107000 naming the
    parameter, before anything is sent (the session stays in step)."""
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise invalid(f"{name} {value} is out of range (at most {INT64_MAX} in magnitude)")
    return value


def check_allocatable(size: int, what: str, padded: bool = False) -> None:
    """Refuse a positive `size` beyond the int64 the daemon is told sizes in, as ACL does: a
    size no size_t holds is 107000, one that wraps when aclrtMalloc pads it (`padded`) is
    ACL's own overflow check (100000, GetAlignedAndPaddingSize), any other is the driver's
    refusal (207001: no device or host has that much memory)."""
    if size <= INT64_MAX:
        return
    if size >= _SIZE_T_END:
        raise invalid(f"size {size} of {what} does not fit a size_t")
    if padded and size > _SIZE_T_END - 1 - _ACL_MALLOC_PAD:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"size {size} of {what} overflows a size_t once aligned and padded",
        )
    raise NpuMemoryError(f"cannot allocate {size} bytes of {what}: more than any memory holds")


def env_memory_limit() -> int:
    """SIMNPU_MEMORY_LIMIT in bytes ('512MiB', '1073741824'); 0 when unset."""
    text = os.environ.get("SIMNPU_MEMORY_LIMIT", "").strip()
    if not text:
        return 0
    try:
        return parse_size(text)
    except ValueError as error:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"SIMNPU_MEMORY_LIMIT: {error}") from None


class RuntimeMemory:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    connection: Connection
    _lock: threading.Lock
    allocation_starts: list[int]
    allocations: dict[int, tuple[int, int]]  # address -> (size, device)
    imported: dict[str, int]  # IPC key -> address (also in allocations)
    imported_counts: dict[str, int]  # IPC key -> imports not yet closed
    pools: dict[int, int]  # memory pool -> device
    pool_blocks: dict[int, int]  # address -> its pool (also in allocations)

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def _check_device(self, device: int) -> None: ...
        def stream(self, handle: int) -> int: ...
        def device_range(self, address: int, count: int) -> None: ...
        def is_managed(self, ptr: int) -> bool: ...
        def free_managed(self, ptr: int) -> None: ...

    # ---- free ----------------------------------------------------------------------------------
    @records_errors
    def free(self, address: int) -> None:
        """aclrtFree: returns the block to the pool at once (does not wait for tasks).

        Checked here against this process's allocations, then sent without waiting for the
        daemon (it frees in order with this process's later calls; anything it still refuses
        is reported at the next synchronize)."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free")
        if self.is_managed(address):
            self.free_managed(address)
            return
        with self._lock:
            if (
                address not in self.allocations
                or address in self.imported.values()
                or address in self.pool_blocks
            ):
                if address in self.imported.values():
                    raise invalid(
                        f"{address:#x} is imported IPC memory: release it with ipc_mem_close"
                    )
                if address in self.pool_blocks:
                    raise invalid(f"{address:#x} comes from a memory pool: use mem_pool_free_async")
                raise invalid(
                    f"{address:#x} is not the start of a live device allocation of this process"
                    " (double free or bad pointer)"
                )
            self._forget(address)
        self.connection.post(pb.FreeRequest(address=address), caller_site())

    def _remember(self, address: int, size: int, device: int) -> None:
        """Add a block this process may use (its own, or imported) to the tables."""
        with self._lock:
            if address not in self.allocations:
                bisect.insort(self.allocation_starts, address)
            self.allocations[address] = (size, device)

    def _forget(self, address: int) -> None:
        """Drop a live allocation from the tables (the caller holds the lock); by bisection,
        not list.remove: with thousands of blocks live, a free must not scan them all."""
        del self.allocations[address]
        starts = self.allocation_starts
        del starts[bisect.bisect_left(starts, address)]

    # ---- information and limits ------------------------------------------------------------
    @records_errors
    def get_mem_info(self, attr: int = codes.ACL_HBM_MEM) -> tuple[int, int]:
        """aclrtGetMemInfo: (free, total) bytes of the current device's memory. Under a memory
        limit, total is the limit and free what is left of it. Blocks."""
        if attr not in _MEM_ATTRS:
            raise invalid(f"unknown memory attribute {attr}")
        reply = self._call(pb.GetMemInfoRequest(device=self._current().device))
        return reply.free, reply.total

    def _device_or_current(self, device: int | None) -> int:
        device = self._current().device if device is None else device
        self._check_device(device)
        return device

    @records_errors
    def memory_stats(self, device: int | None = None) -> dict:
        """The device pool's statistics (torch.cuda.memory_stats key names; docs/memory.md).
        Blocks."""
        device = self._device_or_current(device)
        return json.loads(self._call(pb.MemoryStatsRequest(device=device)).json)

    @records_errors
    def memory_snapshot(self, device: int | None = None) -> list[dict]:
        """The device's live blocks in address order, each with its owner (every client's).
        Blocks."""
        device = self._device_or_current(device)
        return json.loads(self._call(pb.MemorySnapshotRequest(device=device)).json)

    @records_errors
    def set_memory_limit(self, limit: int, device: int | None = None) -> None:
        """Lower this process's device-memory limit (bytes; 0 restores the daemon's default)
        on `device`, or on every device when None. A limit above the daemon's default is
        refused (107000). Blocks."""
        if not isinstance(limit, int) or limit < 0:
            raise invalid(f"a memory limit must be a byte count >= 0, not {limit!r}")
        wire_int(limit, "limit")
        if device is not None:
            self._check_device(device)
        self._call(pb.MemoryLimitRequest(device=device, limit=limit))

    @records_errors
    def memory_limit(self, device: int | None = None) -> tuple[int | None, int, int | None]:
        """(limit in force or None, bytes this process holds, the daemon's default or None)
        on `device` (default: the current one). Blocks."""
        device = self._device_or_current(device)
        reply = self._call(pb.MemoryLimitRequest(device=device))
        return reply.limit or None, reply.used, reply.default or None

    # ---- IPC memory ----------------------------------------------------------------------------
    @records_errors
    def device_get_bare_tgid(self) -> int:
        """aclrtDeviceGetBareTgid: the process id an exporter whitelists: this process's pid as
        the daemon sees it (its pid namespace), verified through the credentials socket; 0
        when it could not be (TCP, no credentials socket, a process the daemon cannot see),
        and such a process imports only keys exported without pid validation."""
        return self.connection.verified_pid

    @records_errors
    def ipc_mem_get_export_key(self, address: int, size: int, flags: int = 0) -> str:
        """aclrtIpcMemGetExportKey: a key that lets other processes import [address, address+size)
        of one of this process's allocations. flags: 0 = only whitelisted pids may import,
        1 (ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION) = any process. Blocks."""
        if not address:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to ipc_mem_get_export_key"
            )
        if not isinstance(size, int) or size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot share {size!r} bytes")
        if address in self.imported.values():
            raise invalid(f"{address:#x} is imported IPC memory; only its owner can export it")
        self.device_range(address, size)
        wire_int(flags, "flags")
        return self._call(pb.IpcMemExportRequest(address=address, size=size, flags=flags)).key

    @records_errors
    def ipc_mem_set_import_pid(self, key: str, pids) -> None:
        """aclrtIpcMemSetImportPid: whitelist processes (their device_get_bare_tgid) for `key`.
        Blocks."""
        pids = [wire_int(int(pid), "pid") for pid in pids]
        if not key or not pids:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, "ipc_mem_set_import_pid needs a key and pids"
            )
        self._call(pb.IpcMemSetImportPidRequest(key=_key(key), pids=pids))

    @records_errors
    def ipc_mem_import_by_key(self, key: str, flags: int = 0) -> int:
        """aclrtIpcMemImportByKey: the device address of the memory exported under `key`,
        usable here like this process's own until ipc_mem_close(key). Blocks."""
        if not key:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "empty IPC key")
        key = _key(key)
        wire_int(flags, "flags")
        reply = self._call(pb.IpcMemImportRequest(key=key, flags=flags))
        with self._lock:
            self.imported_counts[key] = self.imported_counts.get(key, 0) + 1
            first = key not in self.imported
            if first:
                self.imported[key] = reply.address
        if first:
            self._remember(reply.address, reply.size, reply.device)
        return reply.address

    @records_errors
    def ipc_mem_close(self, key: str) -> None:
        """aclrtIpcMemClose: an importer stops using the key's memory; the exporter closes
        the key (after every importer has). Blocks."""
        if not key:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "empty IPC key")
        key = _key(key)
        self._call(pb.IpcMemCloseRequest(key=key))
        with self._lock:
            count = self.imported_counts.get(key, 0) - 1
            if count > 0:
                self.imported_counts[key] = count
            elif key in self.imported:
                del self.imported_counts[key]
                address = self.imported.pop(key)
                if address not in self.imported.values() and address in self.allocations:
                    self._forget(address)

    # ---- stream-ordered pools ------------------------------------------------------------------
    def _pool(self, pool: int) -> int:
        if pool not in self.pools:
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_HANDLE,
                f"memory pool {pool!r} is not valid in this process",
            )
        return pool

    @records_errors
    def mem_pool_create(self, max_size: int = 0, device: int | None = None) -> int:
        """aclrtMemPoolCreate: a stream-ordered pool on `device` (default: the current one);
        `max_size` (props.maxSize) caps it, 0 = no cap but the memory limit. Blocks."""
        device = self._device_or_current(device)
        if not isinstance(max_size, int) or max_size < 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"maxSize must be a byte count >= 0, not {max_size!r}",
            )
        wire_int(max_size, "maxSize")
        pool = self._call(pb.MemPoolCreateRequest(device=device, max_size=max_size)).pool
        self.pools[pool] = device
        return pool

    @records_errors
    def mem_pool_destroy(self, pool: int) -> None:
        """aclrtMemPoolDestroy: blocks still allocated from the pool are freed. Blocks."""
        self._call(pb.MemPoolDestroyRequest(pool=self._pool(pool)))
        with self._lock:
            for address in [a for a, p in self.pool_blocks.items() if p == pool]:
                del self.pool_blocks[address]
                if address in self.allocations:
                    self._forget(address)
            del self.pools[pool]

    @records_errors
    def mem_pool_malloc_async(self, size: int, pool: int, stream: int) -> int:
        """aclrtMemPoolMallocAsync: a block usable by work queued on `stream` (or any stream)
        from now on. Returns the address (blocks for it; no stream synchronisation)."""
        if not isinstance(size, int) or size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size!r} bytes")
        check_allocatable(size, "memory pool memory")
        address = self._call(
            pb.MemPoolMallocRequest(pool=self._pool(pool), size=size, stream=self.stream(stream))
        ).address
        self._remember(address, size, self.pools[pool])
        self.pool_blocks[address] = pool
        return address

    @records_errors
    def mem_pool_free_async(self, address: int, stream: int) -> None:
        """aclrtMemPoolFreeAsync (async): the block returns to the device once `stream` has
        run everything queued on it before this call."""
        stream = self.stream(stream)
        with self._lock:
            if self.pool_blocks.pop(address, None) is None:
                raise invalid(f"{address:#x} is not a live block of a memory pool of this process")
            self._forget(address)
        self.connection.post(pb.MemPoolFreeRequest(address=address, stream=stream), caller_site())

    @records_errors
    def mem_pool_set_attr(self, pool: int, attr: int, value: int) -> None:
        """aclrtMemPoolSetAttr: release threshold and reuse flags (stored; simnpu's pools do
        not cache), or a high-water attribute reset to 0. Blocks."""
        if not isinstance(value, int) or value < 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"attribute value must be an int >= 0, not {value!r}"
            )
        wire_int(attr, "attr")
        wire_int(value, "value")
        self._call(pb.MemPoolSetAttrRequest(pool=self._pool(pool), attr=attr, value=value))

    @records_errors
    def mem_pool_get_attr(self, pool: int, attr: int) -> int:
        """aclrtMemPoolGetAttr (used/reserved current and high-water bytes, and the settable ones).
        Blocks."""
        wire_int(attr, "attr")
        return self._call(pb.MemPoolGetAttrRequest(pool=self._pool(pool), attr=attr)).value

    @records_errors
    def mem_pool_trim_to(self, pool: int, keep: int) -> None:
        """aclrtMemPoolTrimTo: release the pool's unused reserved memory beyond `keep` bytes
        (a simnpu pool keeps none: freed blocks go back to the device at once). Blocks."""
        wire_int(keep, "minBytesToKeep")
        self._call(pb.MemPoolTrimToRequest(pool=self._pool(pool), min_bytes_to_keep=keep))


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
