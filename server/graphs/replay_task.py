"""A replay of a model run instance (aclmdlRIExecuteAsync, aclmdlRIExecute): one task on the
replaying stream, which holds it until the whole graph has run (docs/graph-capture.md).

At its submission it makes one private stream per lane of the graph (in its stream's
context, listed there while it lives, so an abort, STOP mode and the session's end reach
them) and a replica of every recorded task on its lane's stream, `submitted()` in capture
order: an event recorded in the graph has the replica's record as its latest from then on,
so a stream waiting for it after aclmdlRIExecuteAsync waits for the replay, and a wait of
the graph binds to the records submitted before the replay (an external dependency). When
its stream reaches it, the replicas are queued; it completes when those streams have
drained, with the earliest failure among them.

A built model's streams that are not heads are held: their replicas are queued when a
control-flow task of the replay activates them (`activate`, server/graphs/flow_tasks.py), and
dropped if none does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.streams import Failure, Stream
from simnpu.server.core.tasks.base import Task, TaskState
from simnpu.server.core.tasks.kernel import KernelTask
from simnpu.server.core.tasks.kernel_run import KernelRunTask, joins, runnable
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs.flow_tasks import FlowTask
from simnpu.server.graphs.task_groups import updatable

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.graphs.capture import Graph, Lane


class ReplayTask(Task):
    __slots__ = (
        "aborted",
        "copies",
        "fuse",
        "graph",
        "held",
        "lanes",
        "new_handle",
        "replicas",
        "streams",
    )
    kind = "replay"
    capturable = False  # a graph inside a graph is not built yet

    def __init__(
        self,
        seq: int,
        stream: Stream,
        graph: Graph,
        new_handle: Callable[[], int],
        fuse: bool,
    ):
        super().__init__(seq, stream)
        self.fuse = fuse  # runs of kernels go out as one item (unobserved replays)
        self.graph = graph
        self.new_handle = new_handle  # a handle for each private stream (never the client's)
        self.lanes: list[Stream] = []
        self.replicas: list[Task] = []
        self.streams: dict[Lane, Stream] = {}  # each lane's private stream
        self.held: dict[Stream, list[Task]] = {}  # replicas of built lanes not activated yet
        # the replicas of the graph's task group kernels, which an update may still change
        # (server/graphs/task_groups.py)
        self.copies: dict[Task, Task] = {}
        self.aborted = False  # aclmdlRIAbort

    def submitted(self) -> None:
        graph, context = self.graph, self.stream.context
        graph.running.add(self)  # queued counts as running (aclmdlRIDestroy waits for it)
        streams = {}
        for lane in graph.lanes:
            stream = Stream(self.new_handle(), context, self.stream.priority)
            streams[lane] = stream
            context.streams.append(stream)
        self.lanes = list(streams.values())
        self.streams = streams
        if graph.build is not None:
            self.held = {streams[lane]: [] for lane in graph.lanes if lane not in graph.build.heads}
        order = graph.order
        if graph.disabled:  # aclmdlRITaskDisable
            order = [(lane, task) for lane, task in order if task not in graph.disabled]
        grouped = updatable(graph) if graph.groups else frozenset()
        replicas: list[Task] = []
        runs: dict[Stream, list[KernelTask]] = {}  # each stream's run of kernels so far
        for lane, task in order:
            stream = streams[lane]
            if self.fuse and runnable(task) and task not in grouped:
                run = runs.get(stream)
                if run is not None and joins(run, task):  # type: ignore[arg-type]
                    run.append(task)  # type: ignore[arg-type]
                    continue
                if run is not None:
                    replicas.append(_run_of(run, stream))
                runs[stream] = [task]  # type: ignore[list-item]
                continue
            run = runs.pop(stream, None)
            if run is not None:
                replicas.append(_run_of(run, stream))
            replica = task.replica(stream)
            if task in grouped:
                self.copies[task] = replica
            replicas.append(replica)
        replicas.extend(_run_of(run, stream) for stream, run in runs.items())
        self.replicas = replicas
        for replica in replicas:
            if isinstance(replica, FlowTask):
                replica.replay = self
            replica.submitted()

    def discarded(self, scheduler: Scheduler) -> None:
        self._drop(scheduler)
        self._finish(scheduler)

    def _drop(self, scheduler: Scheduler) -> None:
        """Nothing of it runs: its replicas are dropped (their waiters released)."""
        for replica in self.replicas:
            scheduler.discard(replica)
        self.replicas = []
        self._drop_held(scheduler)

    def _drop_held(self, scheduler: Scheduler) -> None:
        """The replicas of built lanes nothing activated are dropped."""
        for replicas in self.held.values():
            for replica in replicas:
                scheduler.discard(replica)
        self.held = {}

    def activate(self, lane: Lane, scheduler: Scheduler) -> None:
        """A control-flow task started `lane` (once; again does nothing)."""
        for replica in self.held.pop(self.streams[lane], []):
            scheduler.queue(replica)

    def start(self, scheduler: Scheduler) -> bool:
        if self.aborted:  # aclmdlRIAbort before its stream reached it: nothing of it runs
            self._drop(scheduler)
            self._finish(scheduler)
            return True
        self.state = TaskState.DISPATCHED
        for subscriber in scheduler.subscribers:
            lanes = [(lane.handle, stream) for lane, stream in zip(self.graph.lanes, self.lanes)]
            subscriber.replaying(self.stream, self.graph.id, lanes)
        replicas, self.replicas = self.replicas, []
        for replica in replicas:
            held = self.held.get(replica.stream)
            if held is None:
                scheduler.queue(replica)
            else:
                held.append(replica)
        if self._drained():
            self._drop_held(scheduler)
            self._finish(scheduler)
            return True
        scheduler.watch(
            Waiter(self._drained, lambda timed_out: self._complete(scheduler)), streams=self.lanes
        )
        return False

    def _drained(self) -> bool:
        return all(not stream.tasks for stream in self.lanes)

    def _finish(self, scheduler: Scheduler) -> None:
        for subscriber in scheduler.subscribers:
            subscriber.replayed(self.stream, self.lanes)
        context = self.stream.context
        for stream in self.lanes:
            if stream.failure is not None and (
                self.failure is None or stream.failure.seq < self.failure.seq
            ):
                self.failure = stream.failure
            if stream in context.streams:
                context.streams.remove(stream)
        self.lanes = []
        self.copies = {}
        if self.aborted:
            self.failure = Failure(
                codes.ACL_ERROR_RT_MODEL_ABORT_NORMAL,
                f"aclmdlRIAbort ended the replay of model {self.graph.id} (task {self.seq})",
                self.seq,
            )
        self.graph.running.discard(self)

    def _complete(self, scheduler: Scheduler) -> None:
        self._drop_held(scheduler)
        self._finish(scheduler)
        scheduler.complete(self)

    def timeline_entry(self) -> tuple[str | None, int]:
        return None, len(self.graph.order)

    def describe(self) -> tuple[str, str, dict]:
        return f"replay of model {self.graph.id}", "replay", {"tasks": len(self.graph.order)}


def _run_of(kernels: list[KernelTask], stream: Stream) -> Task:
    """What a replay submits on `stream` for recorded kernels that follow one another there."""
    return kernels[0].replica(stream) if len(kernels) == 1 else KernelRunTask(stream, kernels)
