"""Kernel modules and launches (aclrtBinaryLoad*, aclrtBinaryGetFunction, aclrtLaunchKernel*)."""

from __future__ import annotations

import os

from simnpu.client.device import runtime
from simnpu.client.stream import Stream, current_stream
from simnpu.proto import commands
from simnpu.proto.kernel_abi import KernelSignature


class Kernel:
    """A kernel function; launch(num_blocks, *args) packs args by its declared types."""

    def __init__(self, handle: int, name: str):
        self.handle = handle
        self.name = name
        self.signature = runtime().signature(handle)

    def __repr__(self) -> str:
        return f"<simnpu Kernel {self.name}({self.signature.to_wire()})>"

    def launch(self, num_blocks: int, *args, stream: Stream | None = None) -> None:
        """aclrtLaunchKernelWithHostArgs (async). Buffers pass as their device pointers; a
        value that does not fit its parameter's type is a ValueError naming the argument."""
        values = [int(a) if hasattr(a, "ptr") else a for a in args]
        stream = current_stream() if stream is None else stream
        try:
            packed = self.signature.pack(*values)
        except TypeError:  # raised by the value itself (a numpy array has no single int)
            raise self._refused(values) from None
        runtime().launch_kernel(self.handle, num_blocks, packed, stream.handle)

    def _refused(self, values: list) -> ValueError:
        """The error for the first of `values` that its parameter's type cannot hold."""
        for index, (kind, value) in enumerate(zip(self.signature.types, values)):
            try:
                KernelSignature((kind,)).pack(value)
            except (TypeError, ValueError):
                given = f"{type(value).__module__}.{type(value).__qualname__}"
                if kind != "ptr":
                    return ValueError(
                        f"{self.name}: kernel argument {index} ({kind}) must be a number, "
                        f"not {given}"
                    )
                return ValueError(
                    f"{self.name}: kernel argument {index} (ptr) must be a device pointer (an "
                    f"int or a DeviceBuffer), not {given}: copy host data to the device first "
                    "(DeviceBuffer.from_array(array)) and pass the buffer"
                )
        return ValueError(f"{self.name}: kernel arguments {values!r} do not fit its parameters")


class Module:
    """A loaded kernel module (a Python source file of @kernel functions)."""

    def __init__(self, handle: int, name: str):
        self.handle = handle
        self.name = name

    @classmethod
    def load(cls, path: str | os.PathLike) -> Module:
        """aclrtBinaryLoadFromFile."""
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        return cls(runtime().binary_load(source, os.fspath(path)), os.fspath(path))

    @classmethod
    def from_source(cls, source: str, name: str = "<kernel module>") -> Module:
        """aclrtBinaryLoadFromData."""
        return cls(runtime().binary_load(source, name), name)

    def function(self, name: str) -> Kernel:
        """aclrtBinaryGetFunction."""
        return Kernel(runtime().get_function(self.handle, name), name)

    def unload(self) -> None:
        """aclrtBinaryUnLoad; its kernels become invalid."""
        runtime().binary_unload(self.handle)


def builtin(name: str) -> Kernel:
    """A kernel of the built-in library (add_f32, matmul_f32, softmax_f16, ...)."""
    return Kernel(runtime().get_function(commands.BUILTIN_BINARY, name), name)
