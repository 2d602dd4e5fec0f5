"""aclrtLaunchKernelWithConfig: a launch built with the kernel-arguments builder, with its
launch attributes (server/core/tasks/configured_kernel.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.proto.errors import check_num_blocks
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.functions import Function
from simnpu.server.core.objects import Stream
from simnpu.server.core.tasks import ConfiguredKernelTask

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

_FOREVER = (1 << 64) - 1


@handles(commands.LaunchWithConfig)
def launch_with_config(
    session: Session, record: commands.LaunchWithConfig, limits_from: Stream | None = None
) -> None:
    """aclrtLaunchKernelWithConfig (async): place holders' data is put in a device block of
    the launch's own (counted against the client's memory), freed when the launch is done;
    `limits_from` as for a launch (server/control/handlers/kernels.py)."""
    function = session.handles.get(record.function, Function, "function")
    stream = session.handles.get(record.stream, Stream, "stream")
    check_num_blocks(record.num_blocks)
    arguments = session.memory.arguments
    args, scratch = arguments.with_place_holders(
        stream.device, function.signature, record.args, record.place_holders
    )
    timeout_us = record.timeout_us
    timeout_s = None if not timeout_us else math.inf if timeout_us == _FOREVER else timeout_us / 1e6
    session.submit(
        ConfiguredKernelTask(
            session.seq,
            stream,
            function,
            record.num_blocks,
            function.signature.unpack(args),
            arguments,
            timeout_s,
            session.memory,
            scratch,
        ),
        limits_from,
    )
