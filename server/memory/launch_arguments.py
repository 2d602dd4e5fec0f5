"""A client's device memory as its kernel launches' arguments see it: the `ArgumentResolver`
a launch task is given (server/core/tasks/kernel.py).

A pointer argument into the client's managed memory becomes the same byte's device address
(server/memory/registered_memory.py), and each pointer names the allocation the kernel may
touch through it -- the bounds its blocks are checked against. Arguments that lie in device
memory (aclrtLaunchKernel) are read from it when the launch reaches the head of its stream.
The place holders of aclrtLaunchKernelWithConfig are copied into a device block of the
launch's own, whose addresses the arguments get. A task calls `resolve` only for a kernel
with pointer parameters, so a launch of one without them never comes here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import invalid
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.proto.kernel_abi import KernelSignature
    from simnpu.server.core.functions import Function
    from simnpu.server.memory.client_memory import ClientMemory
    from simnpu.server.memory.device_memory import DeviceWithMemory

MAX_PLACE_HOLDER_BYTES = 64 * 1024  # a handle's whole buffer (MAX_ARGS_BUFF_SIZE)
_ALIGN = 8


class LaunchArguments:
    """The launches' view of one client's memory (any thread: the session's at a launch, the
    scheduler's when a launch reads its arguments from device memory)."""

    def __init__(self, memory: ClientMemory, devices: list[DeviceWithMemory]):
        self._memory = memory
        self._devices = devices

    def resolve(self, function: Function, values: tuple) -> tuple[tuple, tuple]:
        """The kernel's arguments -- a pointer into the client's managed memory translated to
        the same byte's device address -- and the allocations it may touch: its client's,
        passed to it as pointers, as (start, size). A pointer into a reserved range where
        nothing is mapped adds (start, -size) of the range: touching it is a fault, whose
        message names the range."""
        bounds = []
        memory = self._memory
        translated = []
        for kind, value in zip(function.signature.types, values):
            if kind == "ptr" and value:
                value = memory.registered.translate(value)
                allocation = memory.own_allocation(value)
                if allocation is not None:
                    bounds.append(allocation)
                else:
                    reservation = memory.virtual.reservation_at(value)
                    if reservation is not None:
                        bounds.append((reservation.start, -reservation.size))
            translated.append(value)
        return tuple(translated), tuple(bounds)

    def read(self, address: int, size: int) -> bytes:
        """The `size` bytes at device address `address`, checked to be the client's still
        (NpuError otherwise: ClientMemory.device_range)."""
        span = self._memory.device_range(address, size)
        region = self._devices[span.device].region
        return bytes(region.map[span.offset : span.offset + size])

    def with_place_holders(
        self,
        device: int,
        signature: KernelSignature,
        args: bytes,
        place_holders: tuple[tuple[int, bytes], ...],
    ) -> tuple[bytes, int | None]:
        """The argument struct `args` of a launch on `device` (aclrtLaunchKernelWithConfig),
        each place holder's pointer parameter set to a copy of its data in a device block of
        the launch's own (counted against the client's memory); and that block's address,
        which the launch frees when it is done (None without place holders)."""
        if len(args) < signature.end:
            raise invalid(f"kernel arguments need {signature.end} bytes, got {len(args)}")
        pointers = {
            offset for kind, offset in zip(signature.types, signature.offsets) if kind == "ptr"
        }
        total = sum(-(-len(data) // _ALIGN) * _ALIGN for _, data in place_holders)
        if total > MAX_PLACE_HOLDER_BYTES or any(
            offset not in pointers or not data for offset, data in place_holders
        ):
            raise invalid("place holders must be ptr parameters with 1 byte to 64 KiB of data")
        if not place_holders:
            return args, None
        patched = bytearray(args)
        target = self._devices[device]
        scratch = self._memory.allocate(target, total, codes.ACL_MEM_MALLOC_HUGE_FIRST)
        _, base = split_device_address(scratch)
        at = 0
        for offset, data in place_holders:
            target.region.map[base + at : base + at + len(data)] = data
            patched[offset : offset + 8] = (scratch + at).to_bytes(8, "little")
            at += -(-len(data) // _ALIGN) * _ALIGN
        return bytes(patched), scratch
