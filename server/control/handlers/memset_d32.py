"""aclrtMemsetD32Async of pinned host memory: the command that queues its fill
(server/core/tasks/memset_d32.py). Device memory is filled by a copy of the pattern."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.proto.errors import invalid
from simnpu.server.control.handlers.copies import resolve
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.functions import Pinned
from simnpu.server.core.tasks import MemsetD32Task

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


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
