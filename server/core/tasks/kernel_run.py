"""A run of a replay's kernels (docs/graph-capture.md, "A replay"): the single-block launches
that a graph recorded one after the other on one stream, handed to one AI core as one item
(`RunKernels`) and reported as one result.

Eager launches pay the scheduler a token, a report and a completion each; a graph's kernels
are known before its replay starts, so a replay pays those once per run instead. Only
unobserved replays make runs: a traced or checked client's tasks keep their own entries on
the timeline and their own access reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.commands import BUILTIN_BINARY
from simnpu.server.core.streams import Failure
from simnpu.server.core.unit_protocol import LoadModule, RunKernels

from .base import DeviceWork, Task, TaskState
from .kernel import KernelTask

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream

MAX_RUN_KERNELS = 1024  # kernels in one run at most (the size of one message to a core)


def runnable(task: Task) -> bool:
    """Whether a recorded task may run inside a run: a single-block launch whose arguments
    are known (not read from device memory when its stream reaches it)."""
    return (
        task.__class__ is KernelTask
        and task.num_blocks == 1  # type: ignore[attr-defined]
        and task.args is not None  # type: ignore[attr-defined]
    )


def joins(run: list[KernelTask], task: KernelTask) -> bool:
    """Whether `task` may follow the kernels of `run` in one item: the same place runs them
    (built-in or the client's own kernels) and the same cores may."""
    head = run[0]
    return (
        len(run) < MAX_RUN_KERNELS
        and task.tenant is head.tenant
        and task.limits_from is head.limits_from
    )


class KernelRunTask(DeviceWork):
    """Recorded kernels `kernels` (never run themselves) run on `stream`, in order, as one
    piece. Its `seq` is its first kernel's; a failure names the kernel that failed."""

    __slots__ = ("failing", "kernels")
    kind = "kernel"
    unit_kind = KernelTask.unit_kind

    def __init__(self, stream: Stream, kernels: list[KernelTask]):
        head = kernels[0]
        Task.__init__(self, head.seq, stream)
        self.limits_from = head.limits_from
        self.kernels = kernels
        self.failing = head.seq  # the call a failure of the run names
        self.handed = self.out = 0
        self.total = 1

    @property
    def what(self) -> str:
        return f"a run of {len(self.kernels)} kernels"

    @property
    def tenant(self) -> Owner | None:
        return self.kernels[0].tenant

    def hand_out(
        self, scheduler: Scheduler, unit: Unit, units: int
    ) -> tuple[list, Task | None, bool]:
        items: list = []
        saturation = self.stream.saturation
        kernels = []
        for kernel in self.kernels:
            binary = kernel.function.binary
            if binary.id != BUILTIN_BINARY or binary.id not in unit.loaded:
                items.append(LoadModule.pack(binary.id, binary.source, binary.filename))
                if binary.id == BUILTIN_BINARY:
                    unit.loaded.add(binary.id)
            kernels.append(
                (binary.id, kernel.function.name, kernel.args, kernel.bounds, saturation)
            )
        stop = self.stream.context.failure_mode != codes.ACL_CONTINUE_ON_FAILURE
        items.append(RunKernels.pack(scheduler.hand(unit, self), tuple(kernels), stop))
        self.state = TaskState.DISPATCHED
        self.handed = self.out = 1
        return items, self, True

    def failed_at(self, index: int) -> None:
        if 0 <= index < len(self.kernels):
            self.failing = self.kernels[index].seq

    def piece_done(self, scheduler: Scheduler, code: int, end_ns: int, message: str) -> None:
        if code and self.failure is None:
            self.failure = Failure(code, message, self.failing)
        super().piece_done(scheduler, code, end_ns, message)

    def describe(self) -> tuple[str, str, dict]:
        return self.what, "kernel", {"kernels": len(self.kernels)}

    def timeline_entry(self) -> tuple[str | None, int]:
        return self.what, len(self.kernels)
