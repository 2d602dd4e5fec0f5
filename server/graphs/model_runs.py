"""What the calls on model run instances do (aclmdlRI; docs/graph-capture.md): begin, end and
ask about a stream's capture, check that a model may be replayed, destroy and abort it, list
its tasks and print it. Their handlers (server/control/handlers/graph_calls.py) decode the
request, find the session's objects, call one of these and encode the reply; the checks are
the runtime's, in its order, with its codes.

Everything but `check_capture_mode` and the introspection runs under the scheduler lock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import HostCallbackTask
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs import cond_handles
from simnpu.server.graphs.capture import TASK_TYPES, Capture, Graph, Lane, capture_of
from simnpu.server.graphs.task_groups import UpdateStatus

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.tasks import Task
    from simnpu.server.memory.client_memory import ClientMemory

DESTROY_WAIT_S = 10.0  # aclmdlRIDestroy waits this long for running replays (the runtime's)
CAPTURE_MODES = (
    codes.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL,
    codes.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
    codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
)


# ---- capture ------------------------------------------------------------------------------------
def check_capture_mode(mode: int) -> None:
    if mode not in CAPTURE_MODES:
        raise invalid(f"capture mode {mode}: use an aclmdlRICaptureMode")


def begin_capture(
    stream: Stream,
    mode: int,
    into: Graph | None,
    new_model: Callable[[], Graph],
    new_lane: Callable[[Stream], Lane],
) -> Graph:
    """aclmdlRICaptureBegin (a model of `new_model`) / aclmdlRICaptureToModelRIBegin (`into`):
    the model `stream` captures into from now on. 107026 unless `into` was never captured
    (a sub model of aclmdlRIAddCondTask: the runtime's `CheckCaptureModelIsCaptured` takes
    only a model whose capture status is NONE), then 107027 if the stream is in capture."""
    if into is not None and (into.capture is not None or into.lanes or into.build):
        raise NpuError(
            codes.ACL_ERROR_RT_MODEL_CAPTURED,
            f"model {into.id} is "
            + ("being captured" if into.capture is not None else "captured or built already")
            + ": aclmdlRICaptureToModelRIBegin takes a model never captured, a sub model "
            "of aclmdlRIAddCondTask",
        )
    if capture_of(stream) is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURED,
            "the stream is already being captured (aclmdlRICaptureEnd it first)",
        )
    graph = into if into is not None else new_model()
    Capture(graph, stream, mode, new_lane)
    return graph


def end_capture(
    stream: Stream, wrong_thread: bool, drop: Callable[[Graph], None]
) -> tuple[Graph, list[Task]]:
    """aclmdlRICaptureEnd: the model and the tasks the capture recorded into it; 107029 (not
    in capture), 107036 (begun on another stream). 107038 (`wrong_thread`), 507903
    (invalidated), 107025 (a forked stream not joined) and a cond task's refusal drop the
    capture, and the model with it when the capture made it (`drop(model)`)."""
    capture = capture_of(stream)
    if capture is None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
            "the stream is not being captured (aclmdlRICaptureBegin first)",
        )
    if capture.origin is not stream:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
            "the capture was not begun on this stream (end it on its origin stream)",
        )
    graph = capture.graph
    unjoined = capture.unjoined()
    refused = cond_handles.capture_refused(graph, capture.first)
    if wrong_thread or capture.invalid is not None or unjoined or refused:
        capture.end(keep=False)
        # the model was made by this capture: it goes with it (not a cond task's sub model)
        if capture.first == 0 and graph.cond is None:
            drop(graph)
        if wrong_thread:
            raise NpuError(
                codes.ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD,
                "the capture was ended from another thread than the one that began it",
            )
        if capture.invalid is not None:
            raise NpuError(
                codes.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                f"the capture was invalidated: {capture.invalid}",
            )
        if unjoined:
            raise NpuError(
                codes.ACL_ERROR_RT_STREAM_UNJOINED,
                f"{len(unjoined)} stream(s) pulled into the capture were not joined back "
                "into the origin stream (record an event on them and wait for it there)",
            )
        assert refused is not None
        raise NpuError(*refused)
    capture.end(keep=True)
    return graph, [task for _, task in graph.order[capture.first :]]


def capture_status(stream: Stream) -> tuple[int, Graph | None]:
    """aclmdlRICaptureGetInfo: NONE, ACTIVE or INVALIDATED, and the model being captured."""
    capture = capture_of(stream)
    if capture is None:
        return codes.ACL_MODEL_RI_CAPTURE_STATUS_NONE, None
    status = (
        codes.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE
        if capture.invalid is None
        else codes.ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED
    )
    return status, capture.graph


def recorded_calls(tasks: Iterable[Task]) -> tuple[list[int], list[int]]:
    """What a client learns of a model's recorded tasks when its capture or build ends, or
    it is destroyed: their calls' sequence numbers, and the host callbacks among them."""
    tasks = list(tasks)
    return [task.seq for task in tasks], [
        task.callback for task in tasks if isinstance(task, HostCallbackTask)
    ]


# ---- replays ------------------------------------------------------------------------------------
def prepare_replay(scheduler: Scheduler, graph: Graph) -> None:
    """A replay of `graph` is asked for (aclmdlRIExecuteAsync, aclmdlRIExecute): refused with
    107026 while it is captured, 507011 while changed tasks wait for aclmdlRIUpdate or after a
    failed change (server/graphs/task_changes.py), 207000 for a cond task's sub model; else
    its conditions made with ASSIGN_DEFAULT take their default values now
    (`cond_handles.assign_defaults`)."""
    cond_handles.not_sub_model(graph, "replayed")
    if graph.capture is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_MODEL_CAPTURED,
            f"model {graph.id} is being captured (aclmdlRICaptureEnd it first)",
        )
    if graph.status != UpdateStatus.READY:
        raise NpuError(
            codes.ACL_ERROR_RT_MODEL_EXECUTE,
            f"model {graph.id} is not ready: "
            + (
                "its tasks were changed (aclmdlRIUpdate first)"
                if graph.status == UpdateStatus.UPDATING
                else "a change of its tasks failed"
            ),
        )
    cond_handles.assign_defaults(scheduler, graph)


def private_stream(graph: Graph, handle: int) -> Stream:
    """The stream of a replay by aclmdlRIExecute: a private one of the model's context."""
    return Stream(handle, graph.context, 0)


# ---- destroy and abort --------------------------------------------------------------------------
def release(graph: Graph, memory: ClientMemory) -> list[int]:
    """`graph` goes (destroyed, or dropped with the capture that made it): the memory of its
    conditions is freed and the captures still open into its sub models end; the handles of
    it and its parts -- streams, listed tasks, task groups, conditions -- and of its sub
    models, for the session to forget."""
    handles = [cond.handle for cond in graph.conds]
    for sub in cond_handles.release(memory, graph):
        handles += release(sub, memory)
    handles.append(graph.handle)
    handles += [group.handle for group in graph.groups]
    for lane in graph.lanes:
        handles.append(lane.handle)
        handles += lane.task_handles
    return handles


def check_destroyable(graph: Graph) -> None:
    """aclmdlRIDestroy: 207000 for a cond task's sub model (it goes with its model)."""
    cond_handles.not_sub_model(graph, "destroyed")


def check_abortable(graph: Graph) -> None:
    """aclmdlRIAbort: 207000 for a cond task's sub model (it runs only with its model)."""
    cond_handles.not_sub_model(graph, "aborted")


def when_idle(scheduler: Scheduler, graph: Graph, then: Callable[[NpuError | None], None]) -> None:
    """aclmdlRIDestroy waits (under the scheduler): `then(None)` once no replay of `graph`
    runs; `then(error)` at once with 107026 while it is captured, or with 107037 if a replay
    still runs after DESTROY_WAIT_S."""
    if graph.capture is not None:
        then(
            NpuError(
                codes.ACL_ERROR_RT_MODEL_CAPTURED,
                f"model {graph.id} is being captured (aclmdlRICaptureEnd it first)",
            )
        )
        return
    _wait_idle(scheduler, graph, time.monotonic() + DESTROY_WAIT_S, then)


def _wait_idle(
    scheduler: Scheduler, graph: Graph, until: float, then: Callable[[NpuError | None], None]
) -> None:
    """Until no replay runs (a task's waiter settles when that task completes)."""

    def step(timed_out: bool) -> None:
        if timed_out:
            then(
                NpuError(
                    codes.ACL_ERROR_RT_MODEL_RUNNING,
                    f"model {graph.id} is still running after {DESTROY_WAIT_S:.0f} s",
                )
            )
        elif not graph.running:
            then(None)
        else:
            _wait_idle(scheduler, graph, until, then)

    running = list(graph.running)[:1]
    scheduler.watch(Waiter(lambda: not graph.running, step, until), tasks=running)


def destroy(graph: Graph, drop: Callable[[Graph], None]) -> list[Task]:
    """aclmdlRIDestroy, once no replay runs: a built model's bound streams run their tasks
    again, the model goes (`drop`), and so does what its recorded tasks hold; those tasks."""
    if graph.build is not None:
        for stream in list(graph.build.lanes):
            graph.build.unbind(stream)
    drop(graph)
    recorded = [task for _, task in graph.order]
    for task in recorded:
        task.forgotten()
    return recorded


def abort(scheduler: Scheduler, graph: Graph, end_head: Callable[[Stream], None]) -> None:
    """aclmdlRIAbort (under the scheduler): the model's running replays end (their streams'
    queued tasks dropped, running units ended; what waits outside the device at a stream's
    head is ended by `end_head` first: a collective waiting for its peers is withdrawn, the
    peers fail with 507904); each replaying stream's next synchronize reports 507023."""
    for replay in list(graph.running):
        replay.aborted = True
        for stream in replay.lanes:
            end_head(stream)
            scheduler.abort(stream, stop=False)
            stream.failure = None  # the replay reports the abort instead


# ---- introspection ------------------------------------------------------------------------------
def task_type(task: Task) -> int:
    """aclmdlRITaskGetType of a recorded task (DEFAULT for a kind without one)."""
    return TASK_TYPES.get(task.kind, codes.ACL_MODEL_RI_TASK_DEFAULT)


def lane_tasks(lane: Lane, new_handle: Callable[[Task], int]) -> list[tuple[int, Task]]:
    """aclmdlRIGetTasksByStream: (handle, task) of each task of a model's stream; a task
    listed for the first time gets its handle from `new_handle`."""
    while len(lane.task_handles) < len(lane.tasks):
        lane.task_handles.append(new_handle(lane.tasks[len(lane.task_handles)]))
    return list(zip(lane.task_handles, lane.tasks))


def debug_json(graph: Graph, verbose: bool) -> str:
    """aclmdlRIDebugPrint / aclmdlRIDebugJsonPrint: the graph as JSON (every task with
    ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE, with the record a wait waits for and the task group
    a kernel is in, else a count per stream)."""
    where = {
        id(task): [index, position]
        for index, lane in enumerate(graph.lanes)
        for position, task in enumerate(lane.tasks)
    }
    groups = {id(task): group.handle for group in graph.groups for task in group.tasks}
    streams = []
    for index, lane in enumerate(graph.lanes):
        entry: dict = {"stream": index, "tasks": len(lane.tasks)}
        if verbose:
            entry["task_list"] = [
                {
                    "seq_id": position,
                    "type": task_type(task),
                    "kind": task.kind,
                    "name": task.describe()[0],
                    "call": task.seq,
                    # a wait: the [stream, seq_id] of the record it waits for, if in the graph
                    "after": where.get(id(task.follows())),
                    # the handle of the task group it is a kernel of, else 0
                    "group": groups.get(id(task), 0),
                }
                for position, task in enumerate(lane.tasks)
            ]
        streams.append(entry)
    dump = {
        "model_id": graph.id,
        "name": graph.name,
        "tasks": len(graph.order),
        "streams": streams,
    }
    return json.dumps(dump, indent=2)
