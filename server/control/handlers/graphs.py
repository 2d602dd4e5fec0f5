"""Model run instances (aclmdlRI): stream capture begin / end / info, replays (the command
of aclmdlRIExecuteAsync, aclmdlRIExecute), destroy, abort, introspection and the debug
print. The capture state and the graph are server/graphs/capture.py, a replay
server/graphs/replay_task.py; docs/graph-capture.md is the design.

Calls that change or read capture state run under the scheduler (`session.post`), in order
with the commands before them: a command sent before aclmdlRICaptureBegin runs, one sent
after is recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handlers.streams import deadline
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import HostCallbackTask, TaskState
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs import cond_handles
from simnpu.server.graphs.capture import TASK_TYPES, Capture, Graph, Lane, capture_of
from simnpu.server.graphs.replay_task import ReplayTask
from simnpu.server.graphs.task_groups import UpdateStatus
from simnpu.server.hccl.collective_task import CollectiveTask

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

DESTROY_WAIT_S = 10.0  # aclmdlRIDestroy waits this long for running replays (the runtime's)
_MODES = (
    codes.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL,
    codes.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
    codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
)


def _graph(session: Session, handle: int) -> Graph:
    return session.handles.get(handle, Graph, "model run instance")


def _refuse(session: Session, reply_to: int, code: int, message: str) -> None:
    session.respond(reply_to, code=code, message=message)


def _new_lane(session: Session) -> Callable[[Stream], Lane]:
    """How a capture of `session` makes a lane: with a MODEL_STREAM handle."""

    def new_lane(stream: Stream) -> Lane:
        lane = Lane(0)
        lane.handle = session.handles.add(lane, HandleKind.MODEL_STREAM)
        return lane

    return new_lane


def _replay_stream_handle(session: Session) -> Callable[[], int]:
    """How a replay names its private streams (never handles of the table)."""
    return lambda: (HandleKind.REPLAY_STREAM << 40) | session.handles.unique()


# ---- capture ------------------------------------------------------------------------------------
@handles(pb.CaptureBeginRequest)
def capture_begin(session: Session, request: pb.CaptureBeginRequest, reply_to: int) -> object:
    """aclmdlRICaptureBegin (a new model) / aclmdlRICaptureToModelRIBegin (`model` set): 107026
    unless the model was never captured (a sub model of aclmdlRIAddCondTask: the runtime's
    `CheckCaptureModelIsCaptured` takes only a model whose capture status is NONE), then 107027
    if the stream is in capture."""
    stream = session.stream(request.stream)
    if request.mode not in _MODES:
        raise invalid(f"capture mode {request.mode}: use an aclmdlRICaptureMode")
    into = _graph(session, request.model) if request.model else None

    def begin() -> None:
        if into is not None and (into.capture is not None or into.lanes or into.build):
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_MODEL_CAPTURED,
                f"model {into.id} is "
                + ("being captured" if into.capture is not None else "captured or built already")
                + ": aclmdlRICaptureToModelRIBegin takes a model never captured, a sub model "
                "of aclmdlRIAddCondTask",
            )
            return
        if capture_of(stream) is not None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_CAPTURED,
                "the stream is already being captured (aclmdlRICaptureEnd it first)",
            )
            return
        graph = into
        if graph is None:
            graph = Graph(0, session.daemon.next_model_id(), stream.context)
            graph.handle = session.handles.add(graph, HandleKind.MODEL_RI)
        Capture(graph, stream, request.mode, _new_lane(session))
        session.respond(reply_to, pb.CaptureBeginReply(model=graph.handle))

    session.post(begin)
    return LATER


@handles(pb.CaptureEndRequest)
def capture_end(session: Session, request: pb.CaptureEndRequest, reply_to: int) -> object:
    """aclmdlRICaptureEnd: the model, or 107029 (not in capture), 107036 (begun on another
    stream); 107038 (another thread), 507903 (invalidated) and 107025 (a forked stream not
    joined) drop the capture, and the model with it when the capture made it."""
    stream = session.stream(request.stream)

    def end() -> None:
        capture = capture_of(stream)
        if capture is None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
                "the stream is not being captured (aclmdlRICaptureBegin first)",
            )
            return
        if capture.origin is not stream:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
                "the capture was not begun on this stream (end it on its origin stream)",
            )
            return
        graph = capture.graph
        unjoined = capture.unjoined()
        refused = cond_handles.capture_refused(graph, capture.first)
        if request.wrong_thread or capture.invalid is not None or unjoined or refused:
            capture.end(keep=False)
            # the model was made by this capture: it goes with it (not a cond task's sub model)
            if capture.first == 0 and graph.cond is None:
                _forget(session, graph)
            if request.wrong_thread:
                _refuse(
                    session,
                    reply_to,
                    codes.ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD,
                    "the capture was ended from another thread than the one that began it",
                )
            elif capture.invalid is not None:
                _refuse(
                    session,
                    reply_to,
                    codes.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                    f"the capture was invalidated: {capture.invalid}",
                )
            elif unjoined:
                _refuse(
                    session,
                    reply_to,
                    codes.ACL_ERROR_RT_STREAM_UNJOINED,
                    f"{len(unjoined)} stream(s) pulled into the capture were not joined back "
                    "into the origin stream (record an event on them and wait for it there)",
                )
            else:
                assert refused is not None
                _refuse(session, reply_to, *refused)
            return
        capture.end(keep=True)
        recorded = [task for _, task in graph.order[capture.first :]]
        session.respond(
            reply_to,
            pb.CaptureEndReply(
                model=graph.handle,
                seqs=[task.seq for task in recorded],
                callbacks=[t.callback for t in recorded if isinstance(t, HostCallbackTask)],
            ),
        )

    session.post(end)
    return LATER


@handles(pb.CaptureInfoRequest)
def capture_info(session: Session, request: pb.CaptureInfoRequest, reply_to: int) -> object:
    """aclmdlRICaptureGetInfo: NONE, ACTIVE or INVALIDATED, and the model being captured."""
    stream = session.stream(request.stream)

    def answer() -> None:
        capture = capture_of(stream)
        if capture is None:
            session.respond(reply_to, pb.CaptureInfoReply())
            return
        status = (
            codes.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE
            if capture.invalid is None
            else codes.ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED
        )
        session.respond(reply_to, pb.CaptureInfoReply(status=status, model=capture.graph.handle))

    session.post(answer)
    return LATER


# ---- replays ------------------------------------------------------------------------------------
def _not_while_captured(graph: Graph) -> None:
    """107026 while captured; 507011 while changed tasks wait for aclmdlRIUpdate, or after a
    failed change (server/graphs/task_groups.py); 207000 for a cond task's sub model."""
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


@handles(commands.ReplayModel)
def replay_model(session: Session, record: commands.ReplayModel) -> None:
    """aclmdlRIExecuteAsync (async): one task on the stream runs the whole graph."""
    graph = _graph(session, record.model)
    stream = session.stream(record.stream)
    _not_while_captured(graph)
    cond_handles.assign_defaults(session.scheduler, graph)
    session.submit(
        ReplayTask(
            session.seq,
            stream,
            graph,
            _replay_stream_handle(session),
            fuse=not session.scheduler.subscribers,
        )
    )


@handles(pb.ModelExecuteRequest)
def model_execute(session: Session, request: pb.ModelExecuteRequest, reply_to: int) -> object:
    """aclmdlRIExecute: replay on a private stream of the model's context; answer when it ran
    (507046 when `timeout_ms` passed first, -1 waits forever)."""
    graph = _graph(session, request.model)
    _not_while_captured(graph)
    cond_handles.assign_defaults(session.scheduler, graph)
    until = deadline(request.timeout_ms)
    stream = Stream(_replay_stream_handle(session)(), graph.context, 0)
    task = ReplayTask(
        session.seq,
        stream,
        graph,
        _replay_stream_handle(session),
        fuse=not session.scheduler.subscribers,
    )
    scheduler = session.scheduler

    def finish(timed_out: bool) -> None:
        if timed_out:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                f"the replay of model {graph.id} did not finish within {request.timeout_ms} ms",
            )
        else:
            session.respond_failure(reply_to, task.failure)

    def begin() -> None:
        scheduler.submit(task)
        scheduler.watch(Waiter(lambda: task.state == TaskState.DONE, finish, until), tasks=[task])

    session.post(begin)
    return LATER


# ---- destroy and abort --------------------------------------------------------------------------
def _forget(session: Session, graph: Graph) -> None:
    """Remove the handles of `graph`, its streams and its listed tasks, and those of the
    sub models of its cond tasks."""
    for sub in cond_handles.release(graph, session.handles.remove, session.memory):
        _forget(session, sub)
    session.handles.remove(graph.handle)
    for group in graph.groups:
        session.handles.remove(group.handle)
    for lane in graph.lanes:
        session.handles.remove(lane.handle)
        for handle in lane.task_handles:
            session.handles.remove(handle)


@handles(pb.ModelDestroyRequest)
def model_destroy(session: Session, request: pb.ModelDestroyRequest, reply_to: int) -> object:
    """aclmdlRIDestroy: 107026 while captured; waits up to 10 s for its running replays, then
    107037 if one still runs; 207000 for a cond task's sub model (it goes with its model)."""
    graph = _graph(session, request.model)
    cond_handles.not_sub_model(graph, "destroyed")

    def finish(timed_out: bool) -> None:
        if timed_out:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_MODEL_RUNNING,
                f"model {graph.id} is still running after {DESTROY_WAIT_S:.0f} s",
            )
            return
        if graph.build is not None:  # its bound streams run their tasks again
            for stream in list(graph.build.lanes):
                graph.build.unbind(stream)
        _forget(session, graph)
        recorded = [task for _, task in graph.order]
        for task in recorded:
            task.forgotten()
        session.respond(
            reply_to,
            pb.ModelDestroyReply(
                seqs=[task.seq for task in recorded],
                callbacks=[t.callback for t in recorded if isinstance(t, HostCallbackTask)],
            ),
        )

    def begin() -> None:
        if graph.capture is not None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_MODEL_CAPTURED,
                f"model {graph.id} is being captured (aclmdlRICaptureEnd it first)",
            )
            return
        wait(time.monotonic() + DESTROY_WAIT_S)

    def wait(until: float) -> None:
        """Until no replay runs (a task's waiter settles when that task completes)."""

        def step(timed_out: bool) -> None:
            if timed_out or not graph.running:
                finish(timed_out)
            else:
                wait(until)

        running = list(graph.running)[:1]
        session.scheduler.watch(Waiter(lambda: not graph.running, step, until), tasks=running)

    session.post(begin)
    return LATER


@handles(pb.ModelAbortRequest)
def model_abort(session: Session, request: pb.ModelAbortRequest, reply_to: int) -> object:
    """aclmdlRIAbort: the model's running replays end (their streams' queued tasks dropped,
    running units ended, a collective waiting for its peers withdrawn: the peers fail with
    507904); each replaying stream's next synchronize reports 507023."""
    graph = _graph(session, request.model)
    cond_handles.not_sub_model(graph, "aborted")
    scheduler = session.scheduler

    def abort() -> None:
        for replay in list(graph.running):
            replay.aborted = True
            for stream in replay.lanes:
                head = stream.tasks[0] if stream.tasks else None
                if isinstance(head, CollectiveTask):
                    session.collectives.withdraw(head, "aborted (aclmdlRIAbort)")
                scheduler.abort(stream, stop=False)
                stream.failure = None  # the replay reports the abort instead
        session.respond(reply_to)

    session.post(abort)
    return LATER


# ---- introspection ------------------------------------------------------------------------------
@handles(pb.ModelInfoRequest)
def model_info(session: Session, request: pb.ModelInfoRequest, reply_to: int) -> pb.ModelInfoReply:
    """aclmdlRIGetId, aclmdlRIGetName, aclmdlRIGetStreams; aclmdlRISetName (`name` set)."""
    graph = _graph(session, request.model)
    if request.HasField("name"):
        graph.name = request.name
    return pb.ModelInfoReply(
        id=graph.id, name=graph.name, streams=[lane.handle for lane in graph.lanes]
    )


@handles(pb.ModelTasksRequest)
def model_tasks(
    session: Session, request: pb.ModelTasksRequest, reply_to: int
) -> pb.ModelTasksReply:
    """aclmdlRIGetTasksByStream: the tasks of a model's stream, with their handles."""
    lane = session.handles.get(request.stream, Lane, "model stream")
    while len(lane.task_handles) < len(lane.tasks):
        task = lane.tasks[len(lane.task_handles)]
        lane.task_handles.append(session.handles.add(task, HandleKind.MODEL_TASK))
    return pb.ModelTasksReply(
        tasks=[
            pb.ModelTask(
                handle=handle,
                type=TASK_TYPES.get(task.kind, codes.ACL_MODEL_RI_TASK_DEFAULT),
                seq_id=index,
            )
            for index, (handle, task) in enumerate(zip(lane.task_handles, lane.tasks))
        ]
    )


@handles(pb.ModelDumpRequest)
def model_dump(session: Session, request: pb.ModelDumpRequest, reply_to: int) -> pb.ModelDumpReply:
    """aclmdlRIDebugPrint / aclmdlRIDebugJsonPrint: the graph as JSON (every task with
    ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE, with the record a wait waits for and the task group
    a kernel is in, else a count per stream)."""
    graph = _graph(session, request.model)
    verbose = bool(request.flags & codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE)
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
                    "type": TASK_TYPES.get(task.kind, codes.ACL_MODEL_RI_TASK_DEFAULT),
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
    return pb.ModelDumpReply(json=json.dumps(dump, indent=2))
