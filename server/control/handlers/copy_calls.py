"""Copies and memsets: the synchronous calls (aclrtMemcpy, aclrtMemset) and the chunks of
pageable copies, which answer once they ran, and the asynchronous commands (aclrtMemcpyAsync,
aclrtMemsetAsync, aclrtMemsetD32Async of pinned host memory) that queue tasks
(server/core/tasks/copy.py, memset.py, memset_d32.py; device memory is filled by a copy of
the pattern).

A pageable copy travels in chunks, through the client's staging area when it maps it, or
as the bulk bytes of stream messages when it cannot (simnpu.proto.bulk). A synchronous
chunk between device memory and the staging area or the stream is copied by the session's
own thread at once (numpy, outside the GIL) and answered: a hop through the scheduler and a
copy engine would cost about as much as copying the chunk. Every other chunk (those of
aclrtMemcpyAsync, which its stream orders; any chunk while an observer traces or checks,
which follows copies as tasks) is a task of its stream.
"""

from __future__ import annotations

from mmap import mmap
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from simnpu.proto import bulk as wire
from simnpu.proto import commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import invalid
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import CopyTask, MemsetD32Task, MemsetTask, Task
from simnpu.server.core.unit_protocol import Span
from simnpu.server.graphs.capture import capture_of
from simnpu.server.memory.pinned_memory import Pinned

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

Location: TypeAlias = commands.Location | pb.Location  # a record's, or a request's


def resolve(session: Session, location: Location, count: int) -> Span:
    """Where a client's location is, for units; 107000 if it is not its memory or the
    range does not fit."""
    if count < 0:
        raise invalid(f"negative byte count {count}")
    space, offset = location.space, location.offset
    if space == commands.SPACE_DEVICE:
        return session.memory.device_range(offset, count)
    if space == commands.SPACE_PINNED:
        region = session.handles.get(location.id, Pinned, "pinned host memory").region
        size = region.size
    elif space == commands.SPACE_STAGING and session.staging is not None:
        region, size = session.staging, session.daemon.config.staging_bytes
    else:
        raise invalid(f"unknown memory space {space}")
    if offset < 0 or offset + count > size:
        raise invalid(
            f"{count} bytes at offset {offset} exceed the host buffer of {region.size} bytes"
        )
    return Span(region.name, offset)


def _answer_when_done(
    session: Session, reply_to: int, task: Task, read_back: tuple[mmap, int, int] | None
) -> None:
    """Queue `task` and answer `reply_to` once it ran (with the bytes of the staging slot
    `read_back` = (staging, offset, count) as the reply's bulk, for an in-stream chunk to the
    host)."""
    stream = task.stream

    def finish(timed_out: bool) -> None:
        if stream.handle == 0:  # the hidden stream reports its failures to this call only
            stream.failure = None
        if task.failure is not None:
            session.respond_failure(reply_to, task.failure)
        elif read_back is not None and reply_to:
            session.outbox.put(_reply_with(reply_to, *read_back))
        else:
            session.respond(reply_to)

    session.when_done(task, finish)


def _stream(
    session: Session, request: pb.MemcpyRequest | pb.MemsetRequest, device_side: Span
) -> Stream:
    """The request's stream, or the hidden stream of synchronous copies on its device; a
    stream in capture cannot take a copy the host waits for (107000, as the runtime's)."""
    if request.HasField("stream"):
        stream = session.stream(request.stream)
        if capture_of(stream) is not None:
            raise invalid(
                "a copy or memset through pageable host memory cannot be captured "
                "(use pinned memory: aclrtMallocHost)"
            )
        return stream
    return session.immediate_stream(max(device_side.device, 0))


@handles(pb.MemcpyRequest)
def memcpy(session: Session, request: pb.MemcpyRequest, reply_to: int) -> object:
    count = request.count
    dst, src = resolve(session, request.dst, count), resolve(session, request.src, count)
    if commands.SPACE_STAGING in (
        request.dst.space,
        request.src.space,
    ):  # a chunk of a pageable copy
        return _staged(session, reply_to, request, dst, src)
    stream = _stream(session, request, dst if dst.device >= 0 else src)
    _answer_when_done(session, reply_to, CopyTask(session.seq, stream, dst, src, count), None)
    return LATER


def _staged(
    session: Session, reply_to: int, request: pb.MemcpyRequest, dst: Span, src: Span
) -> object:
    """A chunk with the staging area on one side; `inline`: its bytes travel in the stream.
    Never blocks."""
    count, inline = request.count, request.inline
    to_device = request.src.space == commands.SPACE_STAGING
    assert session.staging is not None, "resolve() found the staging side"
    staging = session.staging.map
    data = None
    if to_device and inline:  # the message's bulk bytes are the chunk: one per message
        data, session.bulk = session.bulk, None
        carried = 0 if data is None else data.nbytes
        if carried != count:
            raise invalid(f"inline copy carries {carried} bytes, not {count}")
    device = dst if to_device else src
    if not request.HasField("stream") and device.device >= 0 and not session.scheduler.subscribers:
        memory = session.daemon.devices[device.device].region.map
        if to_device:
            _copy(
                memory,
                device.offset,
                staging if data is None else data,
                src.offset if data is None else 0,
                count,
            )
        elif inline:
            if reply_to:
                session.outbox.put(_reply_with(reply_to, memory, device.offset, count))
            return LATER
        else:
            _copy(staging, dst.offset, memory, device.offset, count)
        return None
    if data is not None:
        _copy(staging, src.offset, data, 0, count)
    read_back = (staging, dst.offset, count) if inline and not to_device else None
    stream = _stream(session, request, device)
    _answer_when_done(
        session, reply_to, CopyTask(session.seq, stream, dst, src, count, staged=True), read_back
    )
    return LATER


@handles(pb.MemsetRequest)
def memset(session: Session, request: pb.MemsetRequest, reply_to: int) -> object:
    """aclrtMemset (no stream), or a memset that answers once it ran."""
    dst = resolve(session, request.dst, request.count)
    stream = _stream(session, request, dst)
    _answer_when_done(
        session,
        reply_to,
        MemsetTask(session.seq, stream, dst, request.value & 0xFF, request.count),
        None,
    )
    return LATER


@handles(commands.Copy)
def copy_command(session: Session, record: commands.Copy) -> None:
    """aclrtMemcpyAsync between device memory and device or pinned memory (async)."""
    stream = session.stream(record.stream)
    dst, src = (
        resolve(session, record.dst, record.count),
        resolve(session, record.src, record.count),
    )
    session.submit(CopyTask(session.seq, stream, dst, src, record.count))


@handles(commands.Memset)
def memset_command(session: Session, record: commands.Memset) -> None:
    """aclrtMemsetAsync (async)."""
    stream = session.stream(record.stream)
    dst = resolve(session, record.dst, record.count)
    session.submit(MemsetTask(session.seq, stream, dst, record.value & 0xFF, record.count))


def _copy(target, target_offset: int, source, source_offset: int, count: int) -> None:
    """Bytes [source_offset, +count) of buffer `source` to `target` at `target_offset`
    (numpy copies without holding the GIL)."""
    np.copyto(
        np.frombuffer(target, np.uint8, count, target_offset),
        np.frombuffer(source, np.uint8, count, source_offset),
    )


def _reply_with(request_id: int, memory, offset: int, count: int) -> bytes:
    """The encoded reply to `request_id` carrying bytes [offset, +count) of `memory` as its
    bulk (read now)."""
    with memoryview(memory) as whole, whole[offset : offset + count] as part:
        return wire.server_message(pb.Reply(id=request_id), part)


@handles(commands.MemsetD32)
def memset_d32(session: Session, record: commands.MemsetD32) -> None:
    """aclrtMemsetD32Async (async): `count` words of `value` into pinned memory."""
    stream = session.stream(record.stream)
    if record.dst.space != commands.SPACE_PINNED:
        raise invalid(f"aclrtMemsetD32Async fills pinned memory here, not space {record.dst.space}")
    if record.dst.offset % 4:
        raise invalid(f"offset {record.dst.offset} is not 4-byte aligned")
    dst = resolve(session, record.dst, 4 * record.count)
    region = session.handles.get(record.dst.id, Pinned, "pinned host memory").region
    session.submit(MemsetD32Task(session.seq, stream, region, dst, record.value, record.count))
