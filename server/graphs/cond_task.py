"""A conditional task of a captured model (aclmdlRIAddCondTask; server/graphs/cond_handles.py,
docs/graph-capture.md "Conditional tasks").

It runs only as a replay's replica, in its lane's order: when its lane reaches it, it reads
the condition, runs the chosen sub model -- one private stream per lane of it, a replica of
each of its tasks, as a replay does -- and holds its lane until they have drained; a WHILE
then reads the condition again, yielding to the scheduler between iterations. The sub
model's streams are the replay's too while they run (`ReplayTask.lanes`), so aclmdlRIAbort
and the end of the session reach them; a failure in the sub model is the task's, hence the
replay's. Cond tasks inside sub models work the same way (the replay is handed down).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks.base import Task, TaskState
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs.flow_tasks import FlowTask

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.graphs.capture import Graph
    from simnpu.server.graphs.cond_handles import CondHandle


class CondTask(FlowTask):
    """Run cond.subs[choice] when reached (IF, SWITCH), or as long as the condition is not 0
    (WHILE)."""

    __slots__ = ("cond", "running", "streams")
    kind = "cond"

    def __init__(self, seq: int, stream: Stream, cond: CondHandle):
        super().__init__(seq, stream)
        self.cond = cond
        self.running: Graph | None = None  # the sub model whose streams `streams` are
        self.streams: list[Stream] = []

    def start(self, scheduler: Scheduler) -> bool:
        replay = self.replay
        if replay is None or self._over():
            self._close(scheduler)
            return True
        sub = self.cond.choose(self.cond.read(scheduler))
        if sub is None:
            self._close(scheduler)
            return True
        self.state = TaskState.DISPATCHED
        replicas = self._replicas(sub, scheduler)
        for replica in replicas:
            scheduler.queue(replica)
        scheduler.watch(
            Waiter(self._drained, lambda timed_out: self._ran(scheduler)), streams=self.streams
        )
        return False

    def _over(self) -> bool:
        """Nothing more of it runs: its replay was aborted, its session or context ended."""
        stream = self.stream
        return bool(
            (self.replay is not None and self.replay.aborted)
            or stream.owner.closed
            or stream.context.failure is not None
        )

    def _replicas(self, sub: Graph, scheduler: Scheduler) -> list[Task]:
        """Replicas of `sub`'s tasks on its streams (made at its first run by this task),
        submitted in capture order."""
        replay = self.replay
        assert replay is not None
        if self.running is not sub:
            self._close(scheduler)
            context = self.stream.context
            self.streams = [
                Stream(replay.new_handle(), context, self.stream.priority) for _ in sub.lanes
            ]
            context.streams.extend(self.streams)
            replay.lanes.extend(self.streams)  # aclmdlRIAbort ends them with the replay's
            self.running = sub
        streams = dict(zip(sub.lanes, self.streams))
        replicas = [task.replica(streams[lane]) for lane, task in sub.order]
        for replica in replicas:
            if isinstance(replica, FlowTask):
                replica.replay = replay
            replica.submitted()
        return replicas

    def _drained(self) -> bool:
        return all(not stream.tasks for stream in self.streams)

    def _ran(self, scheduler: Scheduler) -> None:
        """The sub model ran: a failure ends the task with it; a WHILE goes round again
        (started afresh by the scheduler, so an endless loop never holds it)."""
        for stream in self.streams:
            if stream.failure is not None and (
                self.failure is None or stream.failure.seq < self.failure.seq
            ):
                self.failure = stream.failure
        if (
            self.failure is None
            and self.cond.type == codes.ACL_MODEL_RI_COND_TYPE_WHILE
            and not self._over()
        ):
            self.state = TaskState.PENDING
            scheduler.recheck(self.stream)
            return
        self._close(scheduler)
        scheduler.complete(self)

    def _close(self, scheduler: Scheduler) -> None:
        """Its sub model's streams are gone (its stream comes after them)."""
        if not self.streams:
            return
        for subscriber in scheduler.subscribers:
            subscriber.joined(self.stream, self.streams)
        context = self.stream.context
        for stream in self.streams:
            if stream in context.streams:
                context.streams.remove(stream)
            if self.replay is not None and stream in self.replay.lanes:
                self.replay.lanes.remove(stream)
        self.streams = []
        self.running = None

    def discarded(self, scheduler: Scheduler) -> None:
        self._close(scheduler)  # (dropped between two rounds of a WHILE)

    def forgotten(self) -> None:
        for sub in self.cond.subs:
            for _, task in sub.order:
                task.forgotten()

    def describe(self) -> tuple[str, str, dict]:
        return (
            f"cond {self.cond.name}",
            "model",
            {"sub_models": [sub.id for sub in self.cond.subs]},
        )
