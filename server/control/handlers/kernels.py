"""Kernels: load and unload modules, look functions up, launch them
(server/core/tasks/kernel.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, check_num_blocks, invalid
from simnpu.server.control.handlers.registry import handles
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.functions import Binary, Function
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import KernelTask
from simnpu.server.kernels.discovery import discover

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.BinaryLoadRequest)
def binary_load(
    session: Session, request: pb.BinaryLoadRequest, reply_to: int
) -> pb.BinaryLoadReply:
    """aclrtBinaryLoadFromFile / FromData: the kernels are found in the source, none of it runs
    here. Blocks this session's thread while a child process parses it."""
    filename = request.filename or "<kernel module>"
    kernels = discover(request.source, filename, session.daemon.config.max_module_bytes)
    binary = Binary(session.daemon.next_binary_id(), request.source, filename, kernels)
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
    signature = binary.kernels.get(request.name)
    if signature is None:
        raise NpuError(
            codes.ACL_ERROR_RT_KERNEL_LOOKUP,
            f"no kernel named {request.name!r} in {binary.filename} "
            f"(it has: {', '.join(sorted(binary.kernels)) or 'none'})",
        )
    handle = session.handles.add(Function(binary, request.name, signature), HandleKind.FUNCTION)
    return pb.GetFunctionReply(function=handle, signature=signature.to_wire())


def launch_arguments(session: Session, function: Function, values: tuple) -> tuple[tuple, tuple]:
    """The kernel's arguments -- a pointer into the client's managed memory translated to
    the same byte's device address (server/memory/registered_memory.py) -- and the allocations it
    may touch: its client's, passed to it as pointers, as (start, size). A pointer into a
    reserved range where nothing is mapped adds (start, -size) of the range: touching it is
    a fault, whose message names the range."""
    bounds = []
    memory = session.memory
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


def _stream(session: Session, record: commands.Launch | commands.LaunchDeviceArgs) -> Stream:
    """The stream of a launch, checked with its block count."""
    stream = session.handles.get(record.stream, Stream, "stream")
    check_num_blocks(record.num_blocks)
    return stream


@handles(commands.Launch)
def launch(session: Session, record: commands.Launch) -> None:
    """aclrtLaunchKernelWithHostArgs (async)."""
    function = session.handles.get(record.function, Function, "function")
    values = function.signature.unpack(record.args)
    stream = _stream(session, record)
    session.submit(
        KernelTask(
            session.seq,
            stream,
            function,
            record.num_blocks,
            *launch_arguments(session, function, values),
        )
    )


@handles(commands.LaunchDeviceArgs)
def launch_device_args(session: Session, record: commands.LaunchDeviceArgs) -> None:
    """aclrtLaunchKernel (async): the arguments are read when the launch reaches the head of
    its stream (the range is checked now)."""
    function = session.handles.get(record.function, Function, "function")
    address, size = record.args_ptr, record.args_size
    span = session.device_range(address, size)
    stream = _stream(session, record)
    device = session.daemon.devices[span.device]

    def read_args() -> tuple[tuple, tuple]:
        session.device_range(address, size)  # still this client's
        values = function.signature.unpack(
            bytes(device.region.map[span.offset : span.offset + size])
        )
        return launch_arguments(session, function, values)

    session.submit(
        KernelTask(session.seq, stream, function, record.num_blocks, None, read_args=read_args)
    )
