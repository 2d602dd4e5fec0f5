"""What a session owns besides streams and events: kernel binaries, functions, pinned memory."""

from __future__ import annotations

from dataclasses import dataclass

from simnpu.proto.kernel_abi import KernelSignature
from simnpu.shm.region import Region


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


@dataclass(eq=False)
class Pinned:
    """Page-locked host memory (aclrtMallocHost): a segment the client and the engines map."""

    region: Region

    @property
    def size(self) -> int:
        return self.region.size
