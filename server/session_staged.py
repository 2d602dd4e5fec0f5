"""A session's staged copies: the chunks of its client's copies from and to pageable memory.

The client moves pageable memory in chunks, through its staging area when it maps it
(shared memory), or as the bulk bytes of stream messages when it cannot (another container,
another host, SIMNPU_NO_SHM=1; simnpu.proto.bulk). A synchronous chunk (aclrtMemcpy: the
hidden immediate stream, which orders nothing else) between device memory and the staging
area or the stream is copied by the session's reader thread itself, at once (numpy, outside
the GIL), and answered: a hop through the scheduler and a copy engine would cost about as
much as copying the chunk. Every other chunk (aclrtMemcpyAsync, which its stream orders; any
chunk while an observer traces or checks, which follows copies as tasks) is a task of its
stream, in-stream bytes passing through the staging slot the client named.

A mixin of `Session` (server/session.py): it uses the session's `bulk` (the bulk bytes of the
message being handled), `staging`, `outbox` and `_queue_answered`.
"""

from __future__ import annotations

import numpy as np
from simnpu.proto import bulk as wire
from simnpu.proto import commands, npu_pb2
from simnpu.proto.errors import invalid
from simnpu.server.objects import COPY
from simnpu.server.sentinels import DEFERRED


class SessionStaged:
    def _staged_copy(self, request_id: int, stream_handle: int, dst: commands.Location,
                     src: commands.Location, payload: tuple, inline: bool):
        """MEMCPY with the staging area on one side (aclrtMemcpy / aclrtMemcpyAsync of a
        pageable chunk); `inline`: the bytes travel in the stream. Never blocks."""
        target, source, count = payload
        to_device = src.space == commands.SPACE_STAGING
        data = None
        if to_device and inline:  # the message's bulk bytes are the chunk: one per message
            data, self.bulk = self.bulk, None
            carried = 0 if data is None else data.nbytes
            if carried != count:
                raise invalid(f"inline copy carries {carried} bytes, not {count}")
        device = target if to_device else source
        if (stream_handle == commands.IMMEDIATE and device[0] == "dev"
                and self.daemon.observer is None):
            memory = self.daemon.devices[device[1]].region.map
            if to_device:
                _copy(memory, device[2], self.staging.map if data is None else data,
                      src.offset if data is None else 0, count)
            elif inline:
                if request_id:
                    self.outbox.put(reply_with(request_id, memory, device[2], count))
                return DEFERRED
            else:
                _copy(self.staging.map, dst.offset, memory, device[2], count)
            return []
        if data is not None:
            _copy(self.staging.map, src.offset, data, 0, count)
        read_back = (dst.offset, count) if inline and not to_device else None
        self._queue_answered(request_id, stream_handle, COPY, payload, read_back)
        return DEFERRED


def _copy(target, target_offset: int, source, source_offset: int, count: int) -> None:
    """Bytes [source_offset, +count) of buffer `source` to `target` at `target_offset`
    (numpy copies without holding the GIL)."""
    np.copyto(np.frombuffer(target, np.uint8, count, target_offset),
              np.frombuffer(source, np.uint8, count, source_offset))


def reply_with(request_id: int, memory, offset: int, count: int) -> bytes:
    """The encoded reply to `request_id` carrying bytes [offset, +count) of `memory` (a
    mapping), read now."""
    with memoryview(memory) as whole, whole[offset:offset + count] as part:
        return wire.server_message(npu_pb2.Reply(id=request_id), part)
