"""The raw layer's float overflow calls (aclrtSetDeviceSatMode ... aclrtResetOverflowStatus).

A mixin of `Runtime` (client/runtime.py). The simulated device computes in Inf/NaN mode
only, as chips that support only that mode do: setting it succeeds, the saturation mode is
207000. A stream's overflow switch is kept here (`overflow_switches`); the overflow status
is the daemon's, per context, read and cleared in stream order (server/overflow.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import wire_int
from simnpu.client.transport import caller_site
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from simnpu.client.transport import Connection

OVERFLOW_OUTPUT_SIZE = 64
"""The bytes aclrtGetOverflowStatus writes; any other outputSize is 107000."""


class RuntimeOverflow:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    connection: Connection
    overflow_switches: dict[int, int]  # stream -> its overflow switch, when set to 1

    if TYPE_CHECKING:

        def stream(self, handle: int) -> int: ...
        def device_range(self, address: int, count: int) -> None: ...

    @records_errors
    def set_device_sat_mode(self, mode: int) -> None:
        """aclrtSetDeviceSatMode: ACL_RT_OVERFLOW_MODE_INFNAN, the simulated device's only
        mode; SATURATION is 207000, anything else 107000."""
        if not isinstance(mode, int) or not (
            codes.ACL_RT_OVERFLOW_MODE_SATURATION <= mode < codes.ACL_RT_OVERFLOW_MODE_UNDEF
        ):
            raise invalid(f"float overflow mode {mode!r}: use 0 (saturation) or 1 (Inf/NaN)")
        if mode == codes.ACL_RT_OVERFLOW_MODE_SATURATION:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "only the Inf/NaN mode can be set and the saturation mode is not supported by "
                "the simulated NPU",
            )

    @records_errors
    def get_device_sat_mode(self) -> int:
        """aclrtGetDeviceSatMode: always ACL_RT_OVERFLOW_MODE_INFNAN."""
        return codes.ACL_RT_OVERFLOW_MODE_INFNAN

    @records_errors
    def set_stream_overflow_switch(self, stream: int, flag: int) -> None:
        """aclrtSetStreamOverflowSwitch: 0 or 1 (else 100000, before the stream is looked at)."""
        if flag not in (0, 1):
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"overflow switch {flag}: use 0 or 1")
        stream = self.stream(stream)
        if flag:
            self.overflow_switches[stream] = flag
        else:
            self.overflow_switches.pop(stream, None)

    @records_errors
    def get_stream_overflow_switch(self, stream: int) -> int:
        """aclrtGetStreamOverflowSwitch: 0 until set."""
        return self.overflow_switches.get(self.stream(stream), 0)

    @records_errors
    def get_overflow_status(self, address: int, size: int, stream: int) -> None:
        """aclrtGetOverflowStatus (async): the stream writes its context's overflow status
        (64 bytes: a uint64, 1 after an overflow) at `address`; synchronize to read it."""
        wire_int(size, "outputSize")
        if size != OVERFLOW_OUTPUT_SIZE:
            raise invalid(f"output size {size} is invalid: only {OVERFLOW_OUTPUT_SIZE} bytes")
        stream = self.stream(stream)
        self.device_range(address, OVERFLOW_OUTPUT_SIZE)
        self.connection.post(
            pb.GetOverflowStatusRequest(stream=stream, address=address), caller_site()
        )

    @records_errors
    def reset_overflow_status(self, stream: int) -> None:
        """aclrtResetOverflowStatus (async): the stream clears its context's overflow status."""
        self.connection.post(
            pb.ResetOverflowStatusRequest(stream=self.stream(stream)), caller_site()
        )
