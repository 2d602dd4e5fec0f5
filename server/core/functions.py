"""Kernel binaries and functions as a session owns them (aclrtBinaryLoadFromFile / FromData,
aclrtBinaryGetFunction): what a kernel task runs."""

from __future__ import annotations

from dataclasses import dataclass

from simnpu.proto.kernel_abi import KernelSignature


@dataclass(eq=False)
class Binary:
    """A loaded kernel module (aclrtBinaryLoadFromFile / FromData). `id` is daemon-wide."""

    id: int
    source: str
    filename: str
    kernels: dict  # name -> KernelSignature


@dataclass(eq=False)
class Function:
    """A kernel looked up by name (aclrtBinaryGetFunction)."""

    binary: Binary
    name: str
    signature: KernelSignature
