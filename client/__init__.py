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

import importlib

from simnpu.client.device import Device, connect, device_count, runtime, shutdown
from simnpu.proto import codes
from simnpu.proto.errors import NotSupportedError, NpuError, NpuMemoryError

# Imported when first used: an `acl` program needs none of them (nor numpy) for its session.
_LAZY = {
    "Graph": "captured_graphs",
    "graph": "captured_graphs",
    "TaskGroup": "captured_graphs",
    "Kernel": "kernel_modules",
    "Module": "kernel_modules",
    "builtin": "kernel_modules",
    "DeviceBuffer": "buffers",
    "PinnedBuffer": "buffers",
    "Event": "stream",
    "Stream": "stream",
    "current_stream": "stream",
}

__all__ = [
    "Device",
    "DeviceBuffer",
    "Event",
    "Graph",
    "Kernel",
    "Module",
    "NotSupportedError",
    "NpuError",
    "NpuMemoryError",
    "PinnedBuffer",
    "Stream",
    "TaskGroup",
    "builtin",
    "codes",
    "connect",
    "current_stream",
    "device_count",
    "graph",
    "runtime",
    "shutdown",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'simnpu.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"simnpu.client.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})
