"""The raw layer's host memory that kernels reach: registered pinned memory and managed
memory (aclrtHostRegister(V2), aclrtHostGetDevicePointer, aclrtHostUnregister,
aclrtMemAllocManaged, aclrtFree of managed memory).

A mixin of `Runtime` (client/runtime.py). Only pinned memory (aclrtMallocHost) in shared
memory can be registered: it is a segment the daemon, its workers and this client's kernel
processes map, at a device address range the daemon gives it (server/registered_memory.py,
docs/device-memory.md). Private host memory cannot be mapped by another process: 207000.
"""

from __future__ import annotations

import bisect
import threading
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import check_allocatable, wire_int
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NotSupportedError, NpuError, invalid

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.copies import CopyPaths
    from simnpu.client.hostmem import HostMemory
    from simnpu.client.runtime import ContextInfo

_V1_TYPES = codes.ACL_HOST_REGISTER_IOMEMORY | codes.ACL_HOST_REGISTER_READONLY
_V2_FLAGS = (
    codes.ACL_HOST_REG_MAPPED
    | codes.ACL_HOST_REG_IOMEMORY
    | codes.ACL_HOST_REG_READONLY
    | codes.ACL_HOST_REG_PINNED
)
_V2_MAPPED = codes.ACL_HOST_REG_MAPPED | codes.ACL_HOST_REG_IOMEMORY | codes.ACL_HOST_REG_READONLY


def _param(message: str) -> NpuError:
    """ACL's own parameter check failed (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, message)


class RuntimeHostRegister:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    host: HostMemory
    copies: CopyPaths

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def malloc_host(self, size: int) -> int: ...
        def free_host(self, address: int) -> None: ...
        def drop_managed_advice(self, ptr: int) -> None: ...

    _register_lock: threading.Lock
    _registered: dict[int, tuple[int, int]]  # host start -> (size, device pointer or 0)
    _registered_starts: list[int]  # host starts, sorted
    _aliases: dict[int, int]  # device pointer -> size
    _alias_starts: list[int]
    _managed: set[int]  # host starts of managed memory

    def _init_host_register(self) -> None:
        self._register_lock = threading.Lock()
        self._registered, self._registered_starts = {}, []
        self._aliases, self._alias_starts = {}, []
        self._managed = set()

    # ---- registration ---------------------------------------------------------------------------
    @records_errors
    def host_register(self, ptr: int, size: int, kind: int) -> int:
        """aclrtHostRegister: the device pointer of `[ptr, +size)` of pinned memory, which
        kernels, copies and memsets then reach without copies. Blocks."""
        if not ptr or size <= 0:
            raise _param("null pointer or size 0 passed to host_register")
        wire_int(size, "size")
        if kind & ~_V1_TYPES:
            raise NotSupportedError(
                f"aclrtHostRegister type {kind}: only combinations of "
                "ACL_HOST_REGISTER_IOMEMORY and _READONLY, or 0"
            )
        return self._register(ptr, size, True, False)

    @records_errors
    def host_register_v2(self, ptr: int, size: int, flag: int) -> None:
        """aclrtHostRegisterV2: register `[ptr, +size)` of pinned memory; with
        ACL_HOST_REG_MAPPED (or _IOMEMORY, _READONLY) it gets a device pointer
        (host_get_device_pointer). Blocks."""
        if not ptr or size <= 0:
            raise _param("null pointer or size 0 passed to host_register_v2")
        wire_int(size, "size")
        if not flag & _V2_FLAGS or flag & ~_V2_FLAGS:
            raise invalid(
                f"flag {flag:#x}: an OR of ACL_HOST_REG_MAPPED (0x2), _IOMEMORY (0x4), "
                "_READONLY (0x8) and _PINNED (0x10000000)"
            )
        self._register(ptr, size, bool(flag & _V2_MAPPED), False)

    def _register(self, ptr: int, size: int, mapped: bool, managed: bool) -> int:
        block = self.host.find(ptr)
        if block is None or ptr + size > block.address + block.size:
            raise NotSupportedError(
                f"registering [{ptr:#x}, +{size}): only pinned memory (aclrtMallocHost) can "
                "be registered; another process cannot map a private page of this one"
            )
        if block.region is None:
            raise NotSupportedError(
                f"registering [{ptr:#x}, +{size}): this client has no shared memory with the "
                "daemon (pinned memory is private here), so no device can reach its memory"
            )
        with self._register_lock:
            index = bisect.bisect_right(self._registered_starts, ptr + size - 1) - 1
            if index >= 0:
                start = self._registered_starts[index]
                if ptr < start + self._registered[start][0]:
                    raise NpuError(
                        codes.ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED,
                        f"[{ptr:#x}, +{size}) overlaps host memory registered already "
                        f"([{start:#x}, +{self._registered[start][0]}))",
                    )
            self._registered[ptr] = (size, 0)
            bisect.insort(self._registered_starts, ptr)
        address = 0
        if mapped:
            try:
                reply = self._call(
                    pb.HostRegisterRequest(
                        segment=block.handle,
                        offset=ptr - block.address,
                        size=size,
                        device=self._current().device,
                        host=ptr,
                        managed=managed,
                    )
                )
            except BaseException:
                self._forget_registration(ptr)
                raise
            address = reply.address
            with self._register_lock:
                self._registered[ptr] = (size, address)
                self._aliases[address] = size
                bisect.insort(self._alias_starts, address)
        return address

    @records_errors
    def host_get_device_pointer(self, ptr: int, flag: int) -> int:
        """aclrtHostGetDevicePointer: the device pointer of registered host address `ptr`
        (any byte of a range registered with a device mapping). Never waits."""
        if not ptr:
            raise _param("null pointer passed to host_get_device_pointer")
        if flag != 0:
            raise _param(f"flag {flag}: must be 0")
        start = self._registered_at(ptr)
        if start is None or not self._registered[start][1]:
            raise invalid(f"{ptr:#x} has not been registered for device address mapping")
        return self._registered[start][1] + ptr - start

    @records_errors
    def host_unregister(self, ptr: int) -> None:
        """aclrtHostUnregister of the start of a registered range. Blocks."""
        if not ptr:
            raise _param("null pointer passed to host_unregister")
        if ptr not in self._registered or ptr in self._managed:
            raise NpuError(
                codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED,
                f"{ptr:#x} is not the start of host memory this process registered",
            )
        self._unregister(ptr)

    def _unregister(self, ptr: int) -> None:
        address = self._forget_registration(ptr)
        if address:
            self._call(pb.HostUnregisterRequest(address=address))

    def _forget_registration(self, ptr: int) -> int:
        with self._register_lock:
            _, address = self._registered.pop(ptr)
            del self._registered_starts[bisect.bisect_left(self._registered_starts, ptr)]
            if address:
                del self._aliases[address]
                del self._alias_starts[bisect.bisect_left(self._alias_starts, address)]
        return address

    def _registered_at(self, ptr: int) -> int | None:
        index = bisect.bisect_right(self._registered_starts, ptr) - 1
        if index >= 0:
            start = self._registered_starts[index]
            if ptr < start + self._registered[start][0]:
                return start
        return None

    def unregister_block(self, address: int, size: int) -> None:
        """Pinned memory `[address, +size)` is being freed: its registrations go with it
        (the daemon retires them too)."""
        if not self._registered:
            return
        for start in [s for s in self._registered_starts if address <= s < address + size]:
            self._forget_registration(start)
            self._managed.discard(start)

    def registered_range(self, address: int, count: int) -> bool:
        """Does device range [address, +count) lie in one registered host range?"""
        starts = self._alias_starts
        if not starts:
            return False
        index = bisect.bisect_right(starts, address) - 1
        if index < 0 or address >= starts[index] + self._aliases[starts[index]]:
            return False
        end = starts[index] + self._aliases[starts[index]]
        if address + count > end:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of registered host memory "
                f"(it ends at {end:#x})"
            )
        return True

    # ---- managed memory -------------------------------------------------------------------------
    @records_errors
    def mem_alloc_managed(self, size: int, flag: int) -> int:
        """aclrtMemAllocManaged: `size` bytes usable at the pointer from this process and
        from kernels (pinned memory registered whole); freed with aclrtFree. Blocks."""
        if flag != codes.ACL_RT_MEM_ATTACH_GLOBAL:
            raise _param(f"flag {flag}: must be ACL_RT_MEM_ATTACH_GLOBAL (1)")
        if not isinstance(size, int) or size <= 0:
            raise invalid(f"cannot allocate {size!r} bytes of managed memory")
        check_allocatable(size, "managed memory")
        if not self.copies.shared:
            raise NotSupportedError(
                "managed memory: this client has no shared memory with the daemon, so no "
                "device can reach its host memory"
            )
        ptr = self.malloc_host(size)
        try:
            self._register(ptr, size, True, True)
        except BaseException:
            self.free_host(ptr)
            raise
        self._managed.add(ptr)
        return ptr

    def is_managed(self, ptr: int) -> bool:
        """Is `ptr` the start of managed memory of this process?"""
        return ptr in self._managed

    def free_managed(self, ptr: int) -> None:
        """aclrtFree of managed memory: unregister it and free its pinned memory."""
        self._managed.discard(ptr)
        self.drop_managed_advice(ptr)
        self._unregister(ptr)
        self.free_host(ptr)
