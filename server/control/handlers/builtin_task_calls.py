"""aclrtReduceAsync and aclrtRandomNumAsync: the commands that queue the built-in device
tasks (server/core/tasks/reduce_copy.py, random_num.py) on the client's device memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import builtin_tasks, commands
from simnpu.proto.builtin_tasks import COUNTER_BYTES, WORD_BYTES, RandomParameter
from simnpu.proto.errors import invalid
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.tasks import RandomNumTask, ReduceCopyTask

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(commands.Reduce)
def reduce(session: Session, command: commands.Reduce) -> None:
    """aclrtReduceAsync (async): dst = dst (op) src, `count` bytes."""
    stream = session.stream(command.stream)
    dtype = builtin_tasks.check_reduce(
        command.count, command.kind, command.data_type, command.dst, command.src
    )
    dst = session.memory.device_range(command.dst, command.count)
    src = session.memory.device_range(command.src, command.count)
    if dst.device != stream.device or src.device != stream.device:
        raise invalid("aclrtReduceAsync: dst and src must be memory of the stream's device")
    session.submit(
        ReduceCopyTask(session.seq, stream, dst, src, command.count, command.kind, dtype)
    )


@handles(commands.RandomNum)
def random_num(session: Session, command: commands.RandomNum) -> None:
    """aclrtRandomNumAsync (async)."""
    stream = session.stream(command.stream)
    parameters = tuple(RandomParameter(*p) for p in command.parameters)
    seed, num = RandomParameter(*command.seed), RandomParameter(*command.num)
    names = builtin_tasks.RANDOM_PARAMETERS.get(command.func_type, ())
    dtype = builtin_tasks.check_random(
        command.data_type,
        command.func_type,
        command.result,
        command.counter,
        parameters[: len(names)],
        seed,
        num,
    )
    size = builtin_tasks.element_size(dtype)
    counter = session.memory.device_range(command.counter, COUNTER_BYTES)
    result = session.memory.device_range(command.result, 1)
    start, length = session.memory.own_allocation(command.result) or (command.result, 1)
    room = start + length - command.result

    def form(parameter: RandomParameter, nbytes: int) -> tuple:
        if parameter.is_addr:
            return (tuple(session.memory.device_range(parameter.address, nbytes)),)
        return (parameter.value, parameter.size)

    session.submit(
        RandomNumTask(
            session.seq,
            stream,
            command.func_type,
            dtype,
            result,
            room,
            counter,
            tuple(form(p, size) for p in parameters[: len(names)]),
            form(seed, WORD_BYTES),
            form(num, WORD_BYTES),
        )
    )
