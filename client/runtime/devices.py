"""rt.devices: device queries (aclrtGetDeviceInfo, aclrtGetDeviceCapability,
aclrtQueryDeviceStatus, aclrtGetDeviceUtilizationRate), resource limits
(aclrtGet/Set/ResetDeviceResLimit, aclrtGetResInCurrentThread), peer access and the rule
copies between devices follow, float overflow and saturation, and the error calls
(aclrtGetLastError, aclrtPeekAtLastError, aclrtGetErrorVerbose).

The device is simulated: what it reports is simnpu's own (its AI cores, its memory, the
daemon's measured utilisation), never a real chip's figures; attributes it has no value for
are ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000).

Peer access is this process's state, kept here: aclrtDeviceEnablePeerAccess(peer) from
device d lets d reach peer's memory, one direction only (the CANN runtime's API reference,
aclrtDeviceEnablePeerAccess); a copy between memory of two devices runs on the device of
its stream (for aclrtMemcpy, the current device), which must be one of the two and have
enabled access to the other.

The float overflow mode is the process's, as the runtime's is: kept here and by the daemon,
whose streams take the mode in force when they are created (server/units/float_overflow.py). The
overflow status is the daemon's, per context, read and cleared in stream order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.client import last_error
from simnpu.client.exceptions import EXCEPTIONS
from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import wire_int
from simnpu.client.runtime.streams import check_limit_type
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NotSupportedError, NpuError, invalid
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.client.runtime.shared import Shared
    from simnpu.client.runtime.streams import Streams

OVERFLOW_OUTPUT_SIZE = 64
"""The bytes aclrtGetOverflowStatus writes; any other outputSize is 107000."""
UTILIZATION_NOT_SUPPORTED = -1  # aclrtUtilizationInfo's value for what is not measured

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


class Devices:
    """Device queries, limits, peer access, overflow and errors (see the module docstring)."""

    def __init__(self, shared: Shared, streams: Streams):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._allocations = shared.allocations
        self._streams = streams  # the stream calls (a thread's limits)
        self._peer_access: set[tuple[int, int]] = set()  # (device, peer): device may reach peer's
        self._sat_mode = codes.ACL_RT_OVERFLOW_MODE_INFNAN  # aclrtSetDeviceSatMode

    # ---- queries ---------------------------------------------------------------------------
    def _query(self, device: int, site: str | None) -> pb.DeviceQueryReply:
        self._contexts.check_device(device)
        return self._calls.request(pb.DeviceQueryRequest(device=device), site)

    @records_errors
    def get_device_info(self, device: int, attr: int, site: str | None = None) -> int:
        """aclrtGetDeviceInfo: one aclrtDevAttr of the simulated device. Blocks."""
        answer = _DEVICE_INFO.get(attr)
        if answer is None:
            if attr in _NO_DEVICE_INFO:
                self._contexts.check_device(device)
                raise NotSupportedError(f"aclrtGetDeviceInfo attribute {attr} (no such figure)")
            raise NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"unknown aclrtDevAttr {attr}")
        return answer(self._query(device, site), device)

    @records_errors
    def get_device_capability(self, device: int, feature: int) -> int:
        """aclrtGetDeviceCapability: 0 (not available) for every aclrtDevFeatureType."""
        self._contexts.check_device(device)
        if feature not in _CAPABILITIES:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID, f"unknown aclrtDevFeatureType {feature}"
            )
        return _CAPABILITIES[feature]

    @records_errors
    def query_device_status(self, device: int, site: str | None = None) -> int:
        """aclrtQueryDeviceStatus: an aclrtDeviceStatus. Blocks."""
        return self._query(device, site).status

    @records_errors
    def get_device_utilization_rate(self, device: int, site: str | None = None) -> dict[str, int]:
        """aclrtGetDeviceUtilizationRate: percent of the AI cores' time spent executing since
        the daemon started (a simulated core does cube and vector work alike); AI CPU and
        memory are not measured (-1, as ACL reports memory). Blocks."""
        busy = self._query(device, site).utilization
        return {
            "cube_utilization": busy,
            "vector_utilization": busy,
            "aicpu_utilization": UTILIZATION_NOT_SUPPORTED,
            "memory_utilization": UTILIZATION_NOT_SUPPORTED,
        }

    # ---- resource limits ---------------------------------------------------------------------
    @records_errors
    def get_device_res_limit(self, device: int, kind: int, site: str | None = None) -> int:
        """aclrtGetDeviceResLimit: the cores this process's kernels may use (every AI core
        until set). Blocks."""
        check_limit_type(kind)
        reply = self._query(device, site)
        return reply.cube_limit if kind == codes.ACL_RT_DEV_RES_CUBE_CORE else reply.vector_limit

    @records_errors
    def set_device_res_limit(
        self, device: int, kind: int, value: int, site: str | None = None
    ) -> None:
        """aclrtSetDeviceResLimit: this process's kernels on `device` run on at most `value`
        AI cores from now on (the smaller of the cube and vector limits). Blocks."""
        self._contexts.check_device(device)
        check_limit_type(kind)
        request = pb.SetDeviceResLimitRequest(device=device, type=kind, value=value)
        self._calls.request(request, site)

    @records_errors
    def reset_device_res_limit(self, device: int, site: str | None = None) -> None:
        """aclrtResetDeviceResLimit: every AI core again. Blocks."""
        self._contexts.check_device(device)
        self._calls.request(pb.SetDeviceResLimitRequest(device=device, reset=True), site)

    @records_errors
    def get_res_in_current_thread(self, kind: int, site: str | None = None) -> int:
        """aclrtGetResInCurrentThread: the limit in force for this thread: the limits of the
        stream it uses (aclrtUseStreamResInCurrentThread), else its process's on the current
        device, else every AI core. Blocks."""
        check_limit_type(kind)
        stream = self._streams.thread_res_stream()
        if stream is not None:
            return self._streams.get_stream_res_limit(stream, kind, site)
        return self.get_device_res_limit(self._contexts.current().device, kind, site)

    # ---- peer access ---------------------------------------------------------------------------
    def _peer_pair(self, device: int, peer: int) -> None:
        """Both exist (107001) and differ (100000, as ACL checks before the runtime)."""
        self._contexts.check_device(device)
        self._contexts.check_device(peer)
        if device == peer:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"deviceId {device} cannot be equal to peerDeviceId {peer}",
            )

    @records_errors
    def device_can_access_peer(self, device: int, peer: int) -> int:
        """aclrtDeviceCanAccessPeer: 1 -- every two devices of one daemon can."""
        self._peer_pair(device, peer)
        return 1

    @records_errors
    def device_enable_peer_access(self, peer: int, flags: int) -> None:
        """aclrtDeviceEnablePeerAccess: the current device may reach `peer`'s memory
        (flags is reserved: anything but 0 is ACL_ERROR_FEATURE_UNSUPPORTED)."""
        if flags != 0:
            raise NpuError(
                codes.ACL_ERROR_FEATURE_UNSUPPORTED, f"flags {flags:#x} is reserved and must be 0"
            )
        device = self._contexts.current().device
        self._peer_pair(device, peer)
        self._peer_access.add((device, peer))

    @records_errors
    def device_disable_peer_access(self, peer: int) -> None:
        """aclrtDeviceDisablePeerAccess: the current device no longer reaches `peer`."""
        device = self._contexts.current().device
        self._peer_pair(device, peer)
        self._peer_access.discard((device, peer))

    @records_errors
    def device_peer_access_status(self, device: int, peer: int) -> int:
        """aclrtDevicePeerAccessStatus: 1 when `device` has enabled access to `peer`, else 0
        (107000 for a device outside [0, count), as the runtime's reference says)."""
        count = self._contexts.device_count
        for value in (device, peer):
            if not 0 <= value < count:
                raise invalid(f"device {value} is outside [0, {count})")
        return int((device, peer) in self._peer_access)

    def device_of(self, address: int) -> int:
        """The device of this process's memory at `address` (checked before)."""
        return split_device_address(address)[0]

    def check_peer_copy(self, src: int, dst: int, device: int) -> None:
        """A copy from `src` to `dst` (device memory of this process) run by `device`: between
        two devices it needs `device` to be one of them with access enabled to the other."""
        src_device, dst_device = self.device_of(src), self.device_of(dst)
        if src_device == dst_device:
            return
        other = dst_device if device == src_device else src_device
        if device not in (src_device, dst_device) or (device, other) not in self._peer_access:
            raise invalid(
                f"a copy from device {src_device} to device {dst_device} runs on device "
                f"{device}, which has not enabled peer access to device {other}: call "
                f"aclrtDeviceEnablePeerAccess({other}, 0) with device {device} current"
            )

    # ---- float overflow ------------------------------------------------------------------------
    @records_errors
    def set_device_sat_mode(self, mode: int, site: str | None = None) -> None:
        """aclrtSetDeviceSatMode: the streams created from now on compute in `mode`,
        ACL_RT_OVERFLOW_MODE_SATURATION or _INFNAN (else 107000). Blocks."""
        if not isinstance(mode, int) or not (
            codes.ACL_RT_OVERFLOW_MODE_SATURATION <= mode < codes.ACL_RT_OVERFLOW_MODE_UNDEF
        ):
            raise invalid(f"float overflow mode {mode!r}: use 0 (saturation) or 1 (Inf/NaN)")
        self._calls.request(pb.SetDeviceSatModeRequest(mode=mode), site)
        self._sat_mode = mode

    @records_errors
    def get_device_sat_mode(self) -> int:
        """aclrtGetDeviceSatMode: the mode last set (ACL_RT_OVERFLOW_MODE_INFNAN until then)."""
        return self._sat_mode

    @records_errors
    def get_overflow_status(
        self, address: int, size: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtGetOverflowStatus (async): the stream writes its context's overflow status
        (64 bytes: a uint64, 1 after an overflow) at `address`; synchronize to read it."""
        wire_int(size, "outputSize")
        if size != OVERFLOW_OUTPUT_SIZE:
            raise invalid(f"output size {size} is invalid: only {OVERFLOW_OUTPUT_SIZE} bytes")
        stream = self._contexts.stream(stream)
        self._allocations.device_range(address, OVERFLOW_OUTPUT_SIZE)
        self._calls.post(pb.GetOverflowStatusRequest(stream=stream, address=address), site)

    @records_errors
    def reset_overflow_status(self, stream: int, site: str | None = None) -> None:
        """aclrtResetOverflowStatus (async): the stream clears its context's overflow status."""
        request = pb.ResetOverflowStatusRequest(stream=self._contexts.stream(stream))
        self._calls.post(request, site)

    # ---- errors --------------------------------------------------------------------------------
    def get_last_error(self) -> int:
        """aclrtGetLastError: this thread's last error code, cleared."""
        return last_error.code(clear=True)

    def peek_at_last_error(self) -> int:
        """aclrtPeekAtLastError: the same, not cleared."""
        return last_error.code(clear=False)

    @records_errors
    def get_error_verbose(self, device: int) -> dict:
        """aclrtGetErrorVerbose: ACL_RT_ERROR_AICORE (a software error, ACL_RT_AICORE_ERROR_SW)
        once a kernel of this process failed on the device, else ACL_RT_NO_ERROR; the
        simulated device has no memory (UCE) or link faults to repair."""
        wire_int(device, "device")
        self._contexts.check_device(device)
        failed = device in EXCEPTIONS.kernel_failed
        return {
            "try_repair": 0,
            "has_detail": int(failed),
            "reserved": [0, 0],
            "error_type": codes.ACL_RT_ERROR_AICORE if failed else codes.ACL_RT_NO_ERROR,
            "detail": {
                "uce_info": {"array_size": 0, "mem_uce_info_array": []},
                "aicore_err_type": (
                    codes.ACL_RT_AICORE_ERROR_SW if failed else codes.ACL_RT_AICORE_ERROR_UNKNOWN
                ),
            },
        }
