"""Overflow status tasks (aclrtGetOverflowStatus, aclrtResetOverflowStatus), executed by the
scheduler itself when they reach the head of their stream.

A context's overflow status is set when a kernel of one of its streams raised the overflow
flag (server/units/float_overflow.py). Reading it writes OUTPUT_SIZE bytes to device memory, as the
runtime copies its context's overflow area there; resetting it clears it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.tasks.copy import span_access

from .base import Task

if TYPE_CHECKING:
    from simnpu.server.core.device import Device
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.tasks.base import OwnMemory


OUTPUT_SIZE = 64
"""The bytes aclrtGetOverflowStatus writes (the runtime's OVERFLOW_OUTPUT_SIZE)."""


def status_bytes(overflow: bool) -> bytes:
    """What aclrtGetOverflowStatus writes: a little-endian uint64, 1 after an overflow, else
    0, then zeros up to OUTPUT_SIZE."""
    return (1 if overflow else 0).to_bytes(8, "little") + bytes(OUTPUT_SIZE - 8)


class OverflowStatusTask(Task):
    """Write the context's overflow status to device memory at `address`."""

    __slots__ = ("address", "devices", "memory")
    kind = "overflow_status"

    def __init__(
        self,
        seq: int,
        stream: Stream,
        memory: OwnMemory,
        devices: Sequence[Device],
        address: int,
    ):
        super().__init__(seq, stream)
        self.memory = memory
        self.devices = devices
        self.address = address

    def start(self, scheduler: Scheduler) -> bool:
        address = self.address
        found = self.memory.own_allocation(address)  # checked at submission; freed since?
        if found is None or address + OUTPUT_SIZE > found[0] + found[1]:
            self.fail(
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                f"aclrtGetOverflowStatus: {address:#x} was freed before the task ran",
            )
            return True
        span = self.memory.span(address)
        memory = self.devices[span.device].region.map
        memory[span.offset : span.offset + OUTPUT_SIZE] = status_bytes(self.stream.context.overflow)
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "get overflow status", "overflow", {}

    def accesses(self) -> list[tuple]:
        return [span_access(self.memory.span(self.address), OUTPUT_SIZE, True)]


class OverflowResetTask(Task):
    """Clear the context's overflow status."""

    __slots__ = ()
    kind = "overflow_reset"

    def start(self, scheduler: Scheduler) -> bool:
        self.stream.context.overflow = False
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "reset overflow status", "overflow", {}
