"""Pinned host memory as a session owns it (aclrtMallocHost): a shared segment the client
and the copy engines map."""

from __future__ import annotations

from dataclasses import dataclass

from simnpu.shm.region import Region


@dataclass(eq=False)
class Pinned:
    """Page-locked host memory (aclrtMallocHost): a segment the client and the engines map."""

    region: Region

    @property
    def size(self) -> int:
        return self.region.size
