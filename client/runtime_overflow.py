"""The raw layer's float overflow calls (aclrtSetDeviceSatMode ... aclrtResetOverflowStatus).

A mixin of `Runtime` (client/runtime.py). The float overflow mode is the process's, as
the runtime's is: kept here (`sat_mode`) and by the daemon, whose streams take the mode in
force when they are created (server/overflow.py). A stream's overflow switch is kept here
(`overflow_switches`); the overflow status is the daemon's, per context, read and cleared in
stream order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import wire_int
from simnpu.client.transport import caller_site
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.transport import Connection

OVERFLOW_OUTPUT_SIZE = 64
"""The bytes aclrtGetOverflowStatus writes; any other outputSize is 107000."""


class RuntimeOverflow:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    connection: Connection
    overflow_switches: dict[int, int]  # stream -> its overflow switch, when set to 1
    sat_mode: int  # the aclrtFloatOverflowMode last set (ACL_RT_OVERFLOW_MODE_INFNAN at first)

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def stream(self, handle: int) -> int: ...
        def device_range(self, address: int, count: int) -> None: ...

    @records_errors
    def set_device_sat_mode(self, mode: int) -> None:
        """aclrtSetDeviceSatMode: the streams created from now on compute in `mode`,
        ACL_RT_OVERFLOW_MODE_SATURATION or _INFNAN (else 107000). Blocks."""
        if not isinstance(mode, int) or not (
            codes.ACL_RT_OVERFLOW_MODE_SATURATION <= mode < codes.ACL_RT_OVERFLOW_MODE_UNDEF
        ):
            raise invalid(f"float overflow mode {mode!r}: use 0 (saturation) or 1 (Inf/NaN)")
        self._call(pb.SetDeviceSatModeRequest(mode=mode))
        self.sat_mode = mode

    @records_errors
    def get_device_sat_mode(self) -> int:
        """aclrtGetDeviceSatMode: the mode last set (ACL_RT_OVERFLOW_MODE_INFNAN until then)."""
        return self.sat_mode

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
