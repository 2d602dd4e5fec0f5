"""The calls on model run instances (aclmdlRI): stream capture begin / end / info, replays (the
command of aclmdlRIExecuteAsync, aclmdlRIExecute), destroy, abort, introspection and the debug
print. What they do is server/graphs/model_runs.py (the capture state and the graph:
server/graphs/capture.py, a replay: server/graphs/replay_task.py); docs/graph-capture.md is
the design.

Calls that change or read capture state run under the scheduler (`answer_in_order`), in
order with the commands before them: a command sent before aclmdlRICaptureBegin runs, one
sent after is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.server.control import model_handles
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.synchronize import deadline
from simnpu.server.core.untrusted import MODEL_NAME, check_length
from simnpu.server.graphs import model_runs
from simnpu.server.graphs.capture import Lane
from simnpu.server.graphs.replay_task import ReplayTask
from simnpu.server.hccl.collective_task import withdraw_head

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.streams import Stream


# ---- capture ------------------------------------------------------------------------------------
@handles(pb.CaptureBeginRequest)
def capture_begin(session: Session, request: pb.CaptureBeginRequest, reply_to: int) -> object:
    """aclmdlRICaptureBegin (a new model) / aclmdlRICaptureToModelRIBegin (`model` set)."""
    stream = session.stream(request.stream)
    model_runs.check_capture_mode(request.mode)
    into = model_handles.model(session, request.model) if request.model else None

    def begin() -> pb.CaptureBeginReply:
        graph = model_runs.begin_capture(
            stream,
            request.mode,
            into,
            lambda: model_handles.new_model(session, stream.context),
            model_handles.lane_maker(session),
        )
        return pb.CaptureBeginReply(model=graph.handle)

    return session.answer_in_order(reply_to, begin)


@handles(pb.CaptureEndRequest)
def capture_end(session: Session, request: pb.CaptureEndRequest, reply_to: int) -> object:
    """aclmdlRICaptureEnd: the model and what it recorded."""
    stream = session.stream(request.stream)

    def end() -> pb.CaptureEndReply:
        graph, recorded = model_runs.end_capture(
            stream, request.wrong_thread, model_handles.dropper(session)
        )
        seqs, callbacks = model_runs.recorded_calls(recorded)
        return pb.CaptureEndReply(model=graph.handle, seqs=seqs, callbacks=callbacks)

    return session.answer_in_order(reply_to, end)


@handles(pb.CaptureInfoRequest)
def capture_info(session: Session, request: pb.CaptureInfoRequest, reply_to: int) -> object:
    """aclmdlRICaptureGetInfo: the stream's capture status and model."""
    stream = session.stream(request.stream)

    def answer() -> pb.CaptureInfoReply:
        status, graph = model_runs.capture_status(stream)
        return pb.CaptureInfoReply(status=status, model=graph.handle if graph is not None else 0)

    return session.answer_in_order(reply_to, answer)


# ---- replays ------------------------------------------------------------------------------------
@handles(commands.ReplayModel)
def replay_model(session: Session, record: commands.ReplayModel) -> None:
    """aclmdlRIExecuteAsync (async): one task on the stream runs the whole graph."""
    graph = model_handles.model(session, record.model)
    stream = session.stream(record.stream)
    model_runs.prepare_replay(session.scheduler, graph)
    session.submit(
        ReplayTask(
            session.seq,
            stream,
            graph,
            model_handles.replay_stream_handles(session),
            fuse=not session.scheduler.subscribers,
        )
    )


@handles(pb.ModelExecuteRequest)
def model_execute(session: Session, request: pb.ModelExecuteRequest, reply_to: int) -> object:
    """aclmdlRIExecute: replay on a private stream of the model's context; answer when it ran
    (507046 when `timeout_ms` passed first, -1 waits forever)."""
    graph = model_handles.model(session, request.model)
    model_runs.prepare_replay(session.scheduler, graph)
    until = deadline(request.timeout_ms)
    new_handle = model_handles.replay_stream_handles(session)
    task = ReplayTask(
        session.seq,
        model_runs.private_stream(graph, new_handle()),
        graph,
        new_handle,
        fuse=not session.scheduler.subscribers,
    )

    def finish(timed_out: bool) -> None:
        if timed_out:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                message=f"the replay of model {graph.id} did not finish within "
                f"{request.timeout_ms} ms",
            )
        else:
            session.respond_failure(reply_to, task.failure)

    session.when_done(task, finish, until)
    return LATER


# ---- destroy and abort --------------------------------------------------------------------------
@handles(pb.ModelDestroyRequest)
def model_destroy(session: Session, request: pb.ModelDestroyRequest, reply_to: int) -> object:
    """aclmdlRIDestroy: 107026 while captured; waits up to 10 s for its running replays, then
    107037 if one still runs; 207000 for a cond task's sub model (it goes with its model)."""
    graph = model_handles.model(session, request.model)
    model_runs.check_destroyable(graph)

    def finish(error: NpuError | None) -> None:
        if error is not None:
            session.respond(reply_to, code=error.code, message=error.message)
            return
        seqs, callbacks = model_runs.recorded_calls(
            model_runs.destroy(graph, model_handles.dropper(session))
        )
        session.respond(reply_to, pb.ModelDestroyReply(seqs=seqs, callbacks=callbacks))

    session.post(model_runs.when_idle, session.scheduler, graph, finish)
    return LATER


@handles(pb.ModelAbortRequest)
def model_abort(session: Session, request: pb.ModelAbortRequest, reply_to: int) -> object:
    """aclmdlRIAbort: the model's running replays end (server/graphs/model_runs.py)."""
    graph = model_handles.model(session, request.model)
    model_runs.check_abortable(graph)
    scheduler = session.scheduler

    def end_head(stream: Stream) -> None:
        withdraw_head(stream, "aborted (aclmdlRIAbort)")

    return session.answer_in_order(reply_to, lambda: model_runs.abort(scheduler, graph, end_head))


# ---- introspection ------------------------------------------------------------------------------
@handles(pb.ModelInfoRequest)
def model_info(session: Session, request: pb.ModelInfoRequest, reply_to: int) -> pb.ModelInfoReply:
    """aclmdlRIGetId, aclmdlRIGetName, aclmdlRIGetStreams; aclmdlRISetName (`name` set)."""
    graph = model_handles.model(session, request.model)
    if request.HasField("name"):
        graph.name = check_length(request.name, MODEL_NAME, "the model's name")
    return pb.ModelInfoReply(
        id=graph.id, name=graph.name, streams=[lane.handle for lane in graph.lanes]
    )


@handles(pb.ModelTasksRequest)
def model_tasks(
    session: Session, request: pb.ModelTasksRequest, reply_to: int
) -> pb.ModelTasksReply:
    """aclmdlRIGetTasksByStream: the tasks of a model's stream, with their handles."""
    lane = session.handles.get(request.stream, Lane, "model stream")
    listed = model_runs.lane_tasks(
        lane, lambda task: session.handles.add(task, HandleKind.MODEL_TASK)
    )
    return pb.ModelTasksReply(
        tasks=[
            pb.ModelTask(handle=handle, type=model_runs.task_type(task), seq_id=index)
            for index, (handle, task) in enumerate(listed)
        ]
    )


@handles(pb.ModelDumpRequest)
def model_dump(session: Session, request: pb.ModelDumpRequest, reply_to: int) -> pb.ModelDumpReply:
    """aclmdlRIDebugPrint / aclmdlRIDebugJsonPrint (server/graphs/model_runs.py)."""
    graph = model_handles.model(session, request.model)
    verbose = bool(request.flags & codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE)
    return pb.ModelDumpReply(json=model_runs.debug_json(graph, verbose))
