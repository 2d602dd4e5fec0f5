"""A 32-bit fill of pinned host memory (aclrtMemsetD32Async), run by the scheduler itself
when its stream reaches it: the daemon maps every pinned segment of its clients. (Device
memory is filled by a copy of the pattern, server/core/tasks/copy.py.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simnpu.proto import codes
from simnpu.server.core.tasks.copy import span_access

from .base import Task, size_text

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.unit_protocol import Span
    from simnpu.shm.region import Region


class MemsetD32Task(Task):
    __slots__ = ("count", "dst", "region", "value")
    kind = "memset"

    def __init__(self, seq: int, stream: Stream, region: Region, dst: Span, value: int, count: int):
        super().__init__(seq, stream)
        self.region, self.dst = region, dst
        self.value, self.count = value, count  # the word, and how many

    def start(self, scheduler: Scheduler) -> bool:
        memory = self.region.map
        if memory.closed:  # freed (aclrtFreeHost) while the fill was queued
            self.fail(
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                "aclrtMemsetD32Async: the pinned memory was freed before the task ran",
            )
            return True
        words = np.frombuffer(memory, np.uint32, self.count, self.dst.offset)
        words.fill(self.value)
        return True

    def describe(self) -> tuple[str, str, dict]:
        return (
            f"memset d32 {size_text(4 * self.count)}",
            "memset",
            {"bytes": 4 * self.count, "value": self.value},
        )

    def accesses(self) -> list[tuple]:
        return [span_access(self.dst, 4 * self.count, True)]
