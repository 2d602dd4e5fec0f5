"""aclrtValueWrite / aclrtValueWait: the commands that queue their tasks on a word of the
client's device memory (server/core/tasks/value.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.proto.errors import invalid
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.tasks import ValueWaitTask, ValueWriteTask
from simnpu.server.core.tasks.value import WORD

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.unit_protocol import Span


def _word(session: Session, address: int) -> Span:
    """The 8-byte aligned 64-bit word at `address`, in device memory this client may use."""
    if address % WORD.size:
        raise invalid(f"{address:#x} is not 8-byte aligned (a value is a 64-bit word)")
    return session.memory.device_range(address, WORD.size)


@handles(commands.ValueWrite)
def value_write(session: Session, command: commands.ValueWrite) -> None:
    """aclrtValueWrite (async); the flag is reserved (0)."""
    stream = session.stream(command.stream)
    commands.check_value_flag(commands.ValueWrite, command.flag)
    span = _word(session, command.address)
    session.submit(ValueWriteTask(session.seq, stream, span, command.value))


@handles(commands.ValueWait)
def value_wait(session: Session, command: commands.ValueWait) -> None:
    """aclrtValueWait (async): flag is an ACL_STREAM_WAIT_VALUE_* condition."""
    stream = session.stream(command.stream)
    commands.check_value_flag(commands.ValueWait, command.flag)
    span = _word(session, command.address)
    session.submit(ValueWaitTask(session.seq, stream, span, command.value, command.flag))
