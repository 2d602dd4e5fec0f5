"""What takes the tasks submitted to a stream instead of the stream running them as they are:
its recorder (`Stream.recorder`, None when nothing records).

Graphs give streams their recorders (server/graphs/): a capture records a stream's tasks
into a model run instance, a model the stream is bound to records them into its lanes, a
task group the stream updates turns its kernel launches into updates of the group's kernels.
`Scheduler.submit` asks the stream's recorder to take each task and knows none of them.
Everything here runs under the scheduler lock, in submission order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.tasks import Task


class Recorder(Protocol):
    """The recorder of a stream (`Stream.recorder`)."""

    @property
    def refuses_synchronize(self) -> bool:
        """Whether a synchronize of the stream is refused while this recorder holds it (a
        capture: 107027), so the stream's signal must send the client to the daemon."""

    def take(self, task: Task, scheduler: Scheduler, submitted: bool = False) -> Task | None:
        """`task` was submitted to the stream: None if this recorder took it (nothing of it
        runs now); else the task the stream runs in its place (`task` itself, or one that
        replaces it). `submitted`: the task's `submitted()` has run already, and put its
        stream in this recorder (a wait for a task the recorder took, `followed`)."""

    def followed(self, task: Task) -> None:
        """`task`, submitted to another stream, waits for a task this recorder took (a wait
        on an event recorded here): a capture pulls `task`'s stream in."""
