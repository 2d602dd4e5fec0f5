"""The update of one kernel of a task group (a launch between aclmdlRICaptureTaskUpdateBegin
and End, server/graphs/task_groups.py): when its stream reaches it, the group's kernel runs as the
launch from then on -- in the model's later replays, and in running replays whose streams
have not reached that kernel yet."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.tasks.base import Task, TaskState
from simnpu.server.core.tasks.configured_kernel import ConfiguredKernelTask
from simnpu.server.core.tasks.kernel import KernelTask

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.graphs.capture import Graph
    from simnpu.server.graphs.task_groups import TaskGroup


class TaskUpdateTask(Task):
    __slots__ = ("group", "index", "launch")
    kind = "task_update"
    capturable = False  # (a stream updating a group is never in capture)

    def __init__(self, seq: int, stream: Stream, group: TaskGroup, index: int, launch: KernelTask):
        super().__init__(seq, stream)
        self.group = group
        self.index = index  # the position of the kernel it replaces in the group
        self.launch = launch

    def start(self, scheduler: Scheduler) -> bool:
        group, launch = self.group, self.launch
        if self.index >= len(group.tasks):
            self.fail(
                codes.ACL_ERROR_RT_INTERNAL_ERROR,
                f"the task group has {len(group.tasks)} kernel(s): this launch of "
                f"{launch.function.name} is one more than it can update",
            )
        elif type(launch) is not type(group.tasks[self.index]):
            self.fail(
                codes.ACL_ERROR_RT_TASK_TYPE_NOT_SUPPORT,
                f"kernel {self.index} of the task group was launched with another launch call "
                "than this update (launch it the same way)",
            )
        else:
            target = group.tasks[self.index]
            if isinstance(target, ConfiguredKernelTask):  # it owns the launch's place holders
                assert isinstance(launch, ConfiguredKernelTask)
                target.forgotten()
                target.scratch, launch.scratch = launch.scratch, None
                target.memory, target.timeout_s = launch.memory, launch.timeout_s
            apply_launch(target, launch)
            replace_in_replays(group.graph, target, launch)
            return True
        launch.forgotten()
        return True

    def discarded(self, scheduler: Scheduler) -> None:
        self.launch.discarded(scheduler)

    def describe(self) -> tuple[str, str, dict]:
        return f"update of {self.launch.function.name}", "task_update", {"index": self.index}


def apply_launch(target: KernelTask, launch: KernelTask) -> None:
    """`target` runs as `launch` would: its kernel, blocks and arguments."""
    target.function = launch.function
    target.num_blocks = target.total = launch.num_blocks
    target.args, target.bounds = launch.args, launch.bounds
    target.resolver, target.args_at = launch.resolver, launch.args_at


def replace_in_replays(graph: Graph, target: KernelTask, launch: KernelTask) -> None:
    """The copies of `target` in the model's running replays that their streams have not
    reached yet run as `launch` too (an update the replay waits for, as the runtime's
    examples do); one already reached runs as it was."""
    for replay in graph.running:
        copy = replay.copies.get(target)
        if not isinstance(copy, KernelTask) or copy.state != TaskState.PENDING:
            continue
        tasks = copy.stream.tasks
        if not (tasks and tasks[0] is copy):
            apply_launch(copy, launch)
