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
    """A kernel looked up by name (aclrtBinaryGetFunction). `ran_ns`: how long it ran the
    last time a single-block launch of it did, as its unit reported (None: never yet), which
    task aggregation budgets with (server/core/tasks/kernel.py, `run_budget`)."""

    binary: Binary
    name: str
    signature: KernelSignature
    ran_ns: int | None = None
