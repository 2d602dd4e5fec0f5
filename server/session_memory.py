"""A session's device-memory requests: malloc/free under the client's limit, memory info,
statistics and snapshot, IPC export/import, stream-ordered pools.

A mixin of `Session` (server/session.py), which owns the tables it uses: `allocations`
(device address -> device index of this client's own blocks), `imported` (IPC key ->
(address, size, device) of ranges it imported), `memory_limits` (server/quotas.py) and
`pool_blocks` (server/mem_pools.py).
"""

from __future__ import annotations

import json

from simnpu.proto import codes, npu_pb2
from simnpu.proto.errors import NpuError, invalid
from simnpu.server import quotas
from simnpu.server.mem_pools import SessionPools
from simnpu.server.memory_views import memory_snapshot, memory_stats
from simnpu.shm.addresses import is_device_address, split_device_address


class SessionMemory(SessionPools):
    def _init_memory(self) -> None:
        self._init_pools()
        self.imported: dict[str, tuple[int, int, int]] = {}
        self.memory_limits = quotas.Limits(self.daemon.config.memory_limit, len(self.daemon.devices))

    # ---- malloc / free -----------------------------------------------------------------------
    def _malloc(self, request):
        device = self._device(request.args[0])
        size, policy = request.args[1], request.args[2]
        if size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes")
        address = device.allocate(size, policy, self, self.memory_limits.of(device.index))
        self.allocations[address] = device.index
        if self.daemon.observer is not None:  # checking: remember it and its call site
            self.daemon.observer.allocated(self, device.index, address, size)
        return [address]

    def _free(self, request):
        """aclrtFree. The client checks the pointer first and does not wait for this reply."""
        address = request.args[0]
        if address in self.pool_blocks:
            raise invalid(f"{address:#x} comes from a memory pool: free it with aclrtMemPoolFreeAsync")
        device_index = self.allocations.pop(address, None)
        if device_index is None:
            if any(start == address for start, _, _ in self.imported.values()):
                raise invalid(f"{address:#x} is imported IPC memory: release it with aclrtIpcMemClose")
            owner = self._owner_of(address)
            raise invalid(f"{address:#x} is not the start of a live allocation of this process"
                          + (f" (it belongs to {owner})" if owner else " (double free or bad pointer)"))
        if self.daemon.observer is not None:  # checking: tombstone, freed while in use
            self.daemon.observer.freeing(self, address)
        self._release_block(address, device_index)
        return []

    def _release_block(self, address: int, device_index: int) -> None:
        if not self.daemon.ipc.owner_frees(self, address):
            self.daemon.devices[device_index].free(address)

    def release_memory(self) -> None:
        """The session ends: free its blocks (IPC rules apply), close its imports."""
        for address, device_index in list(self.allocations.items()):
            self._release_block(address, device_index)
        self.allocations.clear()
        self.daemon.ipc.session_ended(self, list(self.imported))
        self.imported.clear()

    def imported_range(self, address: int) -> tuple[int, int] | None:
        """(start, size) of an IPC range this session imported that holds `address`."""
        for start, size, _ in self.imported.values():
            if start <= address < start + size:
                return start, size
        return None

    # ---- information ----------------------------------------------------------------------------
    def _get_mem_info(self, request):
        device = self._device(request.args[0])
        with device.lock:
            free, used = device.allocator.free_bytes, device.allocator.used_by(self)
        return list(quotas.mem_info(self.memory_limits.of(device.index), used, free, device.capacity))

    def _memory_stats(self, request):
        return npu_pb2.Reply(text=json.dumps(memory_stats(self.daemon, self._device(request.args[0]))))

    def _memory_snapshot(self, request):
        return npu_pb2.Reply(text=json.dumps(memory_snapshot(self.daemon, self._device(request.args[0]))))

    def _memory_limit(self, request):
        """args (device or -1 for all, limit: > 0 sets, 0 restores the default, -1 only asks)
        -> (limit in force or 0 for none, bytes this client holds, daemon default or 0)."""
        device_index, limit = request.args[0], request.args[1]
        device = self._device(0 if device_index == -1 else device_index)
        if limit != -1:
            self.memory_limits.set(None if device_index == -1 else device.index, limit)
        return [self.memory_limits.of(device.index) or 0, device.used_by(self),
                self.memory_limits.default or 0]

    # ---- IPC -------------------------------------------------------------------------------------
    def _ipc_export(self, request):
        """args (address, size, flags) -> text: the key."""
        address, size, flags = request.args[0], request.args[1], request.args[2]
        if not is_device_address(address):
            raise invalid(f"{address:#x} is not a device address")
        device_index, _ = split_device_address(address)
        if device_index >= len(self.daemon.devices):
            raise invalid(f"{address:#x} is not on any device")
        allocation = self.daemon.devices[device_index].lookup(address)
        if allocation is None or allocation.owner is not self:
            raise invalid(f"{address:#x} is not inside a device allocation of this process"
                          + (" (imported memory cannot be exported again)" if self.imported_range(address) else ""))
        start = address - (split_device_address(address)[1] - allocation.offset)
        key = self.daemon.ipc.export(self, address, size, flags, (start, allocation.size), device_index)
        return npu_pb2.Reply(text=key)

    def _ipc_set_import_pid(self, request):
        """text: key, args: pids."""
        self.daemon.ipc.set_import_pid(self, request.text, list(request.args))
        return []

    def _ipc_import(self, request):
        """text: key, args (flags,) -> (address, size, device)."""
        export = self.daemon.ipc.import_(self, request.text, request.args[0])
        self.imported[export.key] = (export.address, export.size, export.device)
        return [export.address, export.size, export.device]

    def _ipc_close(self, request):
        """text: key."""
        if self.daemon.ipc.close(self, request.text) is not None:
            self.imported.pop(request.text, None)
        return []


MEMORY_OPS = {
    npu_pb2.OP_MALLOC: "_malloc",
    npu_pb2.OP_FREE: "_free",
    npu_pb2.OP_GET_MEM_INFO: "_get_mem_info",
    npu_pb2.OP_MEMORY_STATS: "_memory_stats",
    npu_pb2.OP_MEMORY_SNAPSHOT: "_memory_snapshot",
    npu_pb2.OP_MEMORY_LIMIT: "_memory_limit",
    npu_pb2.OP_IPC_MEM_EXPORT: "_ipc_export",
    npu_pb2.OP_IPC_MEM_SET_IMPORT_PID: "_ipc_set_import_pid",
    npu_pb2.OP_IPC_MEM_IMPORT: "_ipc_import",
    npu_pb2.OP_IPC_MEM_CLOSE: "_ipc_close",
    npu_pb2.OP_MEM_POOL_CREATE: "_mem_pool_create",
    npu_pb2.OP_MEM_POOL_DESTROY: "_mem_pool_destroy",
    npu_pb2.OP_MEM_POOL_MALLOC: "_mem_pool_malloc",
    npu_pb2.OP_MEM_POOL_FREE: "_mem_pool_free",
    npu_pb2.OP_MEM_POOL_ATTR: "_mem_pool_attr",
}
"""The requests this mixin answers: op -> method name (Session registers them)."""
