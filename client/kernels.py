"""Kernel modules and launches (aclrtBinaryLoad*, aclrtBinaryGetFunction, aclrtLaunchKernel*)."""

from __future__ import annotations

import os

from simnpu.client.device import runtime
from simnpu.client.stream import Stream, current_stream
from simnpu.proto import commands


class Kernel:
    """A kernel function; launch(num_blocks, *args) packs args by its declared types."""

    def __init__(self, handle: int, name: str):
        self.handle = handle
        self.name = name
        self.signature = runtime().signature(handle)

    def __repr__(self) -> str:
        return f"<simnpu Kernel {self.name}({self.signature.to_wire()})>"

    def launch(self, num_blocks: int, *args, stream: Stream | None = None) -> None:
        """aclrtLaunchKernelWithHostArgs (async). Buffers pass as their device pointers."""
        values = [int(a) if hasattr(a, "ptr") else a for a in args]
        stream = current_stream() if stream is None else stream
        runtime().launch_kernel(
            self.handle, num_blocks, self.signature.pack(*values), stream.handle
        )


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
