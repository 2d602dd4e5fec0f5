"""A random number task (aclrtRandomNumAsync) on a copy engine, whole: one piece
(server/units/random_numbers.py runs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto.builtin_tasks import COUNTER_BYTES
from simnpu.server.core.executor import UnitKind
from simnpu.server.core.tasks.copy import span_access
from simnpu.server.core.unit_protocol import RandomNumbers, Span

from .base import DeviceWork, Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


class RandomNumTask(DeviceWork):
    __slots__ = ("counter", "dtype", "func_type", "num", "parameters", "result", "room", "seed")
    kind = "random_num"
    unit_kind = UnitKind.COPY_ENGINE

    def __init__(
        self,
        seq: int,
        stream: Stream,
        func_type: int,
        dtype: str,
        result: Span,
        room: int,
        counter: Span,
        parameters: tuple,
        seed: tuple,
        num: tuple,
    ):
        Task.__init__(self, seq, stream)
        self.handed = self.out = 0
        self.total = 1
        self.func_type = func_type  # aclrtRandomNumFuncType
        self.dtype = dtype  # numpy dtype name
        self.result = result
        self.room = room  # bytes of the result's allocation from `result` on
        self.counter = counter
        self.parameters = parameters  # work.RandomNumbers's form
        self.seed = seed
        self.num = num

    def hand_out(
        self, scheduler: Scheduler, unit: Unit, units: int
    ) -> tuple[list, Task | None, bool]:
        self.handed = self.out = 1
        self.state = TaskState.DISPATCHED
        item = RandomNumbers.pack(
            scheduler.hand(unit, self),
            self.func_type,
            self.dtype,
            self.result,
            self.room,
            self.counter,
            self.parameters,
            self.seed,
            self.num,
        )
        return [item], self, True

    def describe(self) -> tuple[str, str, dict]:
        return f"random numbers {self.dtype}", "copy", {"func_type": self.func_type}

    def timeline_entry(self) -> tuple[str | None, int]:
        return "random", 0

    def accesses(self) -> list[tuple]:
        return [
            span_access(self.counter, COUNTER_BYTES, True),
            span_access(self.result, self.room, True),
        ]
