"""aclrtLaunchKernelWithConfig: a launch built with the kernel-arguments builder, with its
launch attributes (server/core/tasks/configured_kernel.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto.errors import check_num_blocks, invalid
from simnpu.server.control.handlers.kernels import launch_arguments
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.functions import Function
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import ConfiguredKernelTask
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

MAX_PLACE_HOLDER_BYTES = 64 * 1024  # a handle's whole buffer (MAX_ARGS_BUFF_SIZE)
_FOREVER = (1 << 64) - 1
_ALIGN = 8


@handles(commands.LaunchWithConfig)
def launch_with_config(session: Session, record: commands.LaunchWithConfig) -> None:
    """aclrtLaunchKernelWithConfig (async): place holders' data is put in a device block of
    the launch's own (counted against the client's memory), freed when the launch is done."""
    function = session.handles.get(record.function, Function, "function")
    stream = session.handles.get(record.stream, Stream, "stream")
    check_num_blocks(record.num_blocks)
    signature = function.signature
    args = bytearray(record.args)
    if len(args) < signature.end:
        raise invalid(f"kernel arguments need {signature.end} bytes, got {len(args)}")
    pointers = {offset for kind, offset in zip(signature.types, signature.offsets) if kind == "ptr"}
    place_holders = record.place_holders
    total = sum(-(-len(data) // _ALIGN) * _ALIGN for _, data in place_holders)
    if total > MAX_PLACE_HOLDER_BYTES or any(
        offset not in pointers or not data for offset, data in place_holders
    ):
        raise invalid("place holders must be ptr parameters with 1 byte to 64 KiB of data")
    scratch = None
    if place_holders:
        device = session.daemon.devices[stream.device]
        scratch = session.memory.allocate(device, total, codes.ACL_MEM_MALLOC_HUGE_FIRST)
        _, base = split_device_address(scratch)
        at = 0
        for offset, data in place_holders:
            device.region.map[base + at : base + at + len(data)] = data
            args[offset : offset + 8] = (scratch + at).to_bytes(8, "little")
            at += -(-len(data) // _ALIGN) * _ALIGN
    values = signature.unpack(args)
    timeout_us = record.timeout_us
    timeout_s = None if not timeout_us else math.inf if timeout_us == _FOREVER else timeout_us / 1e6
    session.submit(
        ConfiguredKernelTask(
            session.seq,
            stream,
            function,
            record.num_blocks,
            *launch_arguments(session, function, values),
            timeout_s,
            session.memory,
            scratch,
        )
    )
