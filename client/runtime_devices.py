"""The raw layer's device queries, resource limits and memory helpers (a mixin of Runtime):
aclrtGetDeviceInfo, aclrtGetDeviceCapability, aclrtQueryDeviceStatus,
aclrtGetDeviceUtilizationRate, aclrtGet/Set/ResetDeviceResLimit, aclrtGetResInCurrentThread,
aclrtMemsetD32(Async), aclrtFreeWithDevSync, aclrtFreeHostWithDevSync, aclrtCheckMemType.

The device is simulated: what it reports is simnpu's own (its AI cores, its memory, the
daemon's measured utilisation), never a real chip's figures; attributes it has no value for
are ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000).
"""

from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from simnpu.client.hostmem import PAGEABLE, PINNED
from simnpu.client.last_error import records_errors
from simnpu.client.transport import caller_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NotSupportedError, NpuError, invalid

if TYPE_CHECKING:
    from simnpu.client.copies import CopyPaths
    from simnpu.client.hostmem import HostMemory
    from simnpu.client.runtime import ContextInfo
    from simnpu.client.transport import Connection

LIMIT_TYPES = (codes.ACL_RT_DEV_RES_CUBE_CORE, codes.ACL_RT_DEV_RES_VECTOR_CORE)
UTILIZATION_NOT_SUPPORTED = -1  # aclrtUtilizationInfo's value for what is not measured
_MEM_TYPES = codes.ACL_RT_MEM_TYPE_DEV | codes.ACL_RT_MEM_TYPE_DVPP | codes.ACL_RT_MEM_TYPE_RSVD
_WORD = struct.Struct("<I")

# aclrtDevAttr -> how a DeviceQueryReply (and the device index) answers it
_DEVICE_INFO = {
    codes.ACL_DEV_ATTR_AICPU_CORE_NUM: lambda reply, device: 0,  # no AI CPU is simulated
    codes.ACL_DEV_ATTR_AICORE_CORE_NUM: lambda reply, device: reply.ai_cores,
    codes.ACL_DEV_ATTR_CUBE_CORE_NUM: lambda reply, device: reply.ai_cores,
    codes.ACL_DEV_ATTR_VECTOR_CORE_NUM: lambda reply, device: reply.ai_cores,
    codes.ACL_DEV_ATTR_MAX_BLOCK_PER_GRID: lambda reply, device: codes.MAX_NUM_BLOCKS,
    codes.ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE: lambda reply, device: reply.total_memory,
    codes.ACL_DEV_ATTR_PHY_CHIP_ID: lambda reply, device: device,
    codes.ACL_DEV_ATTR_IS_VIRTUAL: lambda reply, device: 0,
}
# aclrtDevAttr values the simulated device has no figure for
_NO_DEVICE_INFO = frozenset(
    value
    for name, value in vars(codes).items()
    if name.startswith("ACL_DEV_ATTR_") and value not in _DEVICE_INFO
)
# aclrtDevFeatureType -> its value (0: the feature is not available on the simulated device)
_CAPABILITIES = {
    codes.ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV: 0,
    codes.ACL_FEATURE_SYSTEM_MEMQ_EVENT_CROSS_DEV: 0,
}


class RuntimeDevices:
    """Device queries, resource limits and memory helpers of Runtime (client/runtime.py)."""

    copies: CopyPaths
    allocations: dict[int, tuple[int, int]]
    connection: Connection
    host: HostMemory

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def _check_device(self, device: int) -> None: ...
        def stream(self, handle: int) -> int: ...
        def device_range(self, address: int, count: int) -> None: ...
        def synchronize_device(self, timeout_ms: int = -1) -> None: ...
        def free(self, address: int) -> None: ...
        def free_host(self, address: int) -> None: ...
        def thread_res_stream(self) -> int | None: ...
        def get_stream_res_limit(self, stream: int, kind: int) -> int: ...

    # ---- queries ---------------------------------------------------------------------------
    def _query(self, device: int) -> pb.DeviceQueryReply:
        self._check_device(device)
        return self._call(pb.DeviceQueryRequest(device=device))

    @records_errors
    def get_device_info(self, device: int, attr: int) -> int:
        """aclrtGetDeviceInfo: one aclrtDevAttr of the simulated device. Blocks."""
        answer = _DEVICE_INFO.get(attr)
        if answer is None:
            if attr in _NO_DEVICE_INFO:
                self._check_device(device)
                raise NotSupportedError(f"aclrtGetDeviceInfo attribute {attr} (no such figure)")
            raise NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"unknown aclrtDevAttr {attr}")
        return answer(self._query(device), device)

    @records_errors
    def get_device_capability(self, device: int, feature: int) -> int:
        """aclrtGetDeviceCapability: 0 (not available) for every aclrtDevFeatureType."""
        self._check_device(device)
        if feature not in _CAPABILITIES:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID, f"unknown aclrtDevFeatureType {feature}"
            )
        return _CAPABILITIES[feature]

    @records_errors
    def query_device_status(self, device: int) -> int:
        """aclrtQueryDeviceStatus: an aclrtDeviceStatus. Blocks."""
        return self._query(device).status

    @records_errors
    def get_device_utilization_rate(self, device: int) -> dict[str, int]:
        """aclrtGetDeviceUtilizationRate: percent of the AI cores' time spent executing since
        the daemon started (a simulated core does cube and vector work alike); AI CPU and
        memory are not measured (-1, as ACL reports memory). Blocks."""
        busy = self._query(device).utilization
        return {
            "cube_utilization": busy,
            "vector_utilization": busy,
            "aicpu_utilization": UTILIZATION_NOT_SUPPORTED,
            "memory_utilization": UTILIZATION_NOT_SUPPORTED,
        }

    # ---- resource limits ---------------------------------------------------------------------
    @staticmethod
    def _limit_type(kind: int) -> None:
        if kind not in LIMIT_TYPES:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"resource type {kind}: use ACL_RT_DEV_RES_CUBE_CORE (0) or "
                "ACL_RT_DEV_RES_VECTOR_CORE (1)",
            )

    @records_errors
    def get_device_res_limit(self, device: int, kind: int) -> int:
        """aclrtGetDeviceResLimit: the cores this process's kernels may use (every AI core
        until set). Blocks."""
        self._limit_type(kind)
        reply = self._query(device)
        return reply.cube_limit if kind == codes.ACL_RT_DEV_RES_CUBE_CORE else reply.vector_limit

    @records_errors
    def set_device_res_limit(self, device: int, kind: int, value: int) -> None:
        """aclrtSetDeviceResLimit: this process's kernels on `device` run on at most `value`
        AI cores from now on (the smaller of the cube and vector limits). Blocks."""
        self._check_device(device)
        self._limit_type(kind)
        self._call(pb.SetDeviceResLimitRequest(device=device, type=kind, value=value))

    @records_errors
    def reset_device_res_limit(self, device: int) -> None:
        """aclrtResetDeviceResLimit: every AI core again. Blocks."""
        self._check_device(device)
        self._call(pb.SetDeviceResLimitRequest(device=device, reset=True))

    @records_errors
    def get_res_in_current_thread(self, kind: int) -> int:
        """aclrtGetResInCurrentThread: the limit in force for this thread: the limits of the
        stream it uses (aclrtUseStreamResInCurrentThread), else its process's on the current
        device, else every AI core. Blocks."""
        self._limit_type(kind)
        stream = self.thread_res_stream()
        if stream is not None:
            return self.get_stream_res_limit(stream, kind)
        return self.get_device_res_limit(self._current().device, kind)

    # ---- memory helpers ------------------------------------------------------------------------
    @records_errors
    def memset_d32(
        self, address: int, mem_size: int, value: int, count: int, stream: int | None
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
        side = self.host.classify(address)
        if side == PAGEABLE:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{address:#x}: only memory allocated by aclrtMalloc or aclrtMallocHost is "
                "supported",
            )
        if not 0 <= value <= 0xFFFFFFFF:
            raise invalid(f"value {value} is not a uint32")
        if stream is not None:
            stream = self.stream(stream)
        if side == PINNED:
            self._fill_pinned(address, value, count, stream)
            return
        pattern = ctypes.create_string_buffer(_WORD.pack(value) * count, 4 * count)
        self.device_range(address, 4 * count)
        self.copies.copy(
            address,
            mem_size,
            ctypes.addressof(pattern),
            4 * count,
            codes.ACL_MEMCPY_HOST_TO_DEVICE,
            stream,
        )

    def _fill_pinned(self, address: int, value: int, count: int, stream: int | None) -> None:
        """Words of `value` into pinned memory: at once without a stream, or when a client's
        pinned memory is its own (in-stream mode: no task can touch it); else in stream order."""
        block = self.host.find(address)
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
        self.connection.send_command(
            commands.MemsetD32.pack(stream, dst, value, count), caller_site(), stream
        )

    @records_errors
    def free_with_dev_sync(self, address: int) -> None:
        """aclrtFreeWithDevSync: wait for the current device's work, then free. Blocks."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free")
        self.synchronize_device()
        self.free(address)

    @records_errors
    def free_host_with_dev_sync(self, address: int) -> None:
        """aclrtFreeHostWithDevSync: wait for the current device's work, then free the pinned
        block. Blocks."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free_host")
        self.synchronize_device()
        self.free_host(address)

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
                self.device_range(address, 1)
            except NpuError:
                return 0
        return 1
