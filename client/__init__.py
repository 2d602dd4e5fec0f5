"""The Pythonic simnpu client. `acl` (pyACL-compatible) stands on the same runtime.

    import numpy as np
    import simnpu.client as npu

    with npu.Device(0) as device:
        stream = npu.Stream()
        x = npu.DeviceBuffer.from_array(np.arange(1024, dtype=np.float32))
        y = npu.DeviceBuffer(x.nbytes)
        npu.builtin("relu_f32").launch(2, x, y, 1024, stream=stream)
        stream.synchronize()
        print(y.to_numpy(np.float32))
"""

from simnpu.client.device import Device, connect, device_count, runtime, shutdown
from simnpu.client.kernels import Kernel, Module, builtin
from simnpu.client.memory import DeviceBuffer, PinnedBuffer
from simnpu.client.stream import Event, Stream, current_stream
from simnpu.proto import codes
from simnpu.proto.errors import NotSupportedError, NpuError, NpuMemoryError

__all__ = [
    "Device",
    "DeviceBuffer",
    "Event",
    "Kernel",
    "Module",
    "NotSupportedError",
    "NpuError",
    "NpuMemoryError",
    "PinnedBuffer",
    "Stream",
    "builtin",
    "codes",
    "connect",
    "current_stream",
    "device_count",
    "runtime",
    "shutdown",
]
