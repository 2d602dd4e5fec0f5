"""Kernels: load and unload modules, look functions up, launch them (server/core/tasks/kernel.py,
configured_kernel.py), the launches of a thread that uses a stream's core limits.

A launch's pointer arguments are resolved by the task through the client's memory view
(server/memory/launch_arguments.py), which also places the data of aclrtLaunchKernelWithConfig's
place holders. A launch of a thread using another stream's limits comes as a ThreadLimited
record: its launch is queued with that stream (`limits_from`), whose core limit bounds it
whatever stream it runs on (server/control/core_limits.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, check_num_blocks, invalid
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.functions import Binary, Function
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import ConfiguredKernelTask, KernelTask
from simnpu.server.core.untrusted import KERNEL_NAME, MODULE_FILENAME, check_length
from simnpu.server.kernels.discovery import discover, log, module_size

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

_FOREVER = (1 << 64) - 1  # a launch's timeout that never ends


@handles(pb.BinaryLoadRequest)
def binary_load(
    session: Session, request: pb.BinaryLoadRequest, reply_to: int
) -> pb.BinaryLoadReply:
    """aclrtBinaryLoadFromFile / FromData: the kernels are found in the source, none of it runs
    here. Blocks this session's thread while the load waits for its client's rate and turn
    (server/control/module_loads.py) and a child process parses it."""
    filename = check_length(request.filename, MODULE_FILENAME, "the module's file name")
    filename = filename or "<kernel module>"
    daemon = session.daemon
    size = module_size(request.source, filename, daemon.limits.module_bytes)
    kernels = daemon.module_loads.load(
        daemon.peer_of(session).key,
        size,
        lambda: discover(
            request.source,
            filename,
            daemon.limits.module_bytes,
            partial(session.owner.lines.warning, log),
        ),
    )
    binary = Binary(daemon.next_binary_id(), request.source, filename, kernels)
    return pb.BinaryLoadReply(binary=session.handles.add(binary, HandleKind.BINARY))


@handles(pb.BinaryUnloadRequest)
def binary_unload(session: Session, request: pb.BinaryUnloadRequest, reply_to: int) -> None:
    """aclrtBinaryUnLoad: its functions become invalid handles."""
    binary = session.handles.get(request.binary, Binary, "binary")
    if request.binary == commands.BUILTIN_BINARY:
        raise invalid("the built-in kernel library cannot be unloaded")
    for handle, obj in session.handles.items():
        if obj is binary or (isinstance(obj, Function) and obj.binary is binary):
            session.handles.remove(handle)


@handles(pb.GetFunctionRequest)
def get_function(
    session: Session, request: pb.GetFunctionRequest, reply_to: int
) -> pb.GetFunctionReply:
    """aclrtBinaryGetFunction."""
    binary = session.handles.get(request.binary, Binary, "binary")
    check_length(request.name, KERNEL_NAME, "the kernel's name")
    signature = binary.kernels.get(request.name)
    if signature is None:
        raise NpuError(
            codes.ACL_ERROR_RT_KERNEL_LOOKUP,
            f"no kernel named {request.name!r} in {binary.filename} "
            f"(it has: {', '.join(sorted(binary.kernels)) or 'none'})",
        )
    handle = session.handles.add(Function(binary, request.name, signature), HandleKind.FUNCTION)
    return pb.GetFunctionReply(function=handle, signature=signature.to_wire())


def _stream(
    session: Session,
    record: commands.Launch | commands.LaunchDeviceArgs | commands.LaunchWithConfig,
) -> Stream:
    """The stream of a launch, checked with its block count."""
    stream = session.handles.get(record.stream, Stream, "stream")
    check_num_blocks(record.num_blocks)
    return stream


@handles(commands.Launch)
def launch(session: Session, record: commands.Launch, limits_from: Stream | None = None) -> None:
    """aclrtLaunchKernelWithHostArgs (async); `limits_from`: the stream whose core limit
    bounds it (a ThreadLimited record's)."""
    function = session.handles.get(record.function, Function, "function")
    values = function.signature.unpack(record.args)
    stream = _stream(session, record)
    session.submit(
        KernelTask(
            session.seq, stream, function, record.num_blocks, values, session.memory.arguments
        ),
        limits_from,
    )


@handles(commands.LaunchDeviceArgs)
def launch_device_args(
    session: Session, record: commands.LaunchDeviceArgs, limits_from: Stream | None = None
) -> None:
    """aclrtLaunchKernel (async): the arguments are read when the launch reaches the head of
    its stream (the range is checked now)."""
    function = session.handles.get(record.function, Function, "function")
    address, size = record.args_ptr, record.args_size
    session.memory.device_range(address, size)
    stream = _stream(session, record)
    session.submit(
        KernelTask(
            session.seq,
            stream,
            function,
            record.num_blocks,
            None,
            session.memory.arguments,
            args_at=(address, size),
        ),
        limits_from,
    )


@handles(commands.LaunchWithConfig)
def launch_with_config(
    session: Session, record: commands.LaunchWithConfig, limits_from: Stream | None = None
) -> None:
    """aclrtLaunchKernelWithConfig (async): place holders' data is put in a device block of
    the launch's own (counted against the client's memory), freed when the launch is done."""
    function = session.handles.get(record.function, Function, "function")
    stream = _stream(session, record)
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


_LAUNCHES: dict[type, Callable[..., None]] = {
    commands.Launch: launch,
    commands.LaunchDeviceArgs: launch_device_args,
    commands.LaunchWithConfig: launch_with_config,
}


@handles(commands.ThreadLimited)
def thread_limited(session: Session, record: commands.ThreadLimited) -> None:
    """A launch (async) bounded by the core limit of the stream its thread uses: queued with
    that stream."""
    _LAUNCHES[type(record.launch)](session, record.launch, session.stream(record.limits))
