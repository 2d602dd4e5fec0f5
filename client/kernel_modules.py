"""Kernel modules and launches (aclrtBinaryLoad*, aclrtBinaryGetFunction, aclrtLaunchKernel*)."""

from __future__ import annotations

import os

from simnpu.client.device import runtime
from simnpu.client.stream import Stream, current_stream
from simnpu.client.transport import call_site
from simnpu.proto import commands
from simnpu.proto.kernel_abi import KernelSignature


class Kernel:
    """A kernel function (aclrtBinaryGetFunction's handle), as Module.function() and
    builtin() return it; `signature` holds its declared parameter types. No ACL call
    (the signature came with the handle). Local."""

    def __init__(self, handle: int, name: str):
        self.handle = handle
        self.name = name
        self.signature = runtime().kernels.signature(handle)

    def __repr__(self) -> str:
        return f"<simnpu Kernel {self.name}({self.signature.to_wire()})>"

    def launch(self, num_blocks: int, *args, stream: Stream | None = None) -> None:
        """aclrtLaunchKernelWithHostArgs: run the kernel on `num_blocks` blocks on `stream`
        (default: current_stream()), with `args` packed by its declared parameter types;
        DeviceBuffers pass as their device pointers. Asynchronous: an argument that does not
        fit its parameter raises ValueError naming it, at once (num_blocks < 1: NpuError
        107000); a failure of the kernel is raised by the next synchronize."""
        stream = current_stream() if stream is None else stream
        try:
            packed = self.signature.pack(*[int(a) if hasattr(a, "ptr") else a for a in args])
        except TypeError:  # raised by the value itself (a numpy array has no single int)
            raise self._refused(list(args)) from None
        runtime().kernels.launch_kernel(
            self.handle, num_blocks, packed, stream.handle, site=call_site()
        )

    def _refused(self, values: list) -> ValueError:
        """The error for the first of `values` that its parameter's type cannot hold."""
        for index, (kind, value) in enumerate(zip(self.signature.types, values)):
            try:
                KernelSignature((kind,)).pack(int(value) if hasattr(value, "ptr") else value)
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
    """A loaded kernel module (a Python source file of @kernel functions), the binary
    aclrtBinaryLoadFromFile or aclrtBinaryLoadFromData gives. Made by load() and
    from_source(); the constructor itself is Local."""

    def __init__(self, handle: int, name: str):
        self.handle = handle
        self.name = name

    @classmethod
    def load(cls, path: str | os.PathLike) -> Module:
        """aclrtBinaryLoadFromFile: load the kernel module at `path` (read here, parsed by
        the daemon: NpuError 100003 if it does not parse). Blocks."""
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        return cls(
            runtime().kernels.binary_load(source, os.fspath(path), site=call_site()),
            os.fspath(path),
        )

    @classmethod
    def from_source(cls, source: str, name: str = "<kernel module>") -> Module:
        """aclrtBinaryLoadFromData: load a kernel module from its source text; `name` is
        what tracebacks and reports call it. Blocks."""
        return cls(runtime().kernels.binary_load(source, name, site=call_site()), name)

    def function(self, name: str) -> Kernel:
        """aclrtBinaryGetFunction: the module's kernel `name` (unknown name: NpuError
        507027). Blocks."""
        return Kernel(runtime().kernels.get_function(self.handle, name, site=call_site()), name)

    def unload(self) -> None:
        """aclrtBinaryUnLoad: its kernels become invalid handles (107017). Blocks."""
        runtime().kernels.binary_unload(self.handle, site=call_site())


def builtin(name: str) -> Kernel:
    """aclrtBinaryGetFunction on the built-in library, loaded in every session (add_f32,
    matmul_f32, softmax_f16, ...): the kernel `name`. Blocks."""
    handle = runtime().kernels.get_function(commands.BUILTIN_BINARY, name, site=call_site())
    return Kernel(handle, name)
