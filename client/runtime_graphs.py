"""The raw layer's model run instance calls (aclmdlRI: graph capture and replay): a mixin of
Runtime (client/runtime.py), which sets the state it uses. docs/graph-capture.md is the
design; the capture state and the graphs are the daemon's (server/graphs.py).

What the host keeps of a model: the calls it recorded (their call sites, so a replay's
failure names where its task was captured), the host callbacks it recorded (each replay runs
them again), its destroy callbacks, and the types and positions of the tasks listed by
aclmdlRIGetTasksByStream.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simnpu.client.capture_modes import MODES, CaptureModes
from simnpu.client.last_error import records_errors
from simnpu.client.transport import caller_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, bad_handle

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.callbacks import HostCallbacks
    from simnpu.client.fast_path import StreamSignals
    from simnpu.client.transport import Connection


@dataclass
class Model:
    """What this process keeps of a model run instance."""

    seqs: list[int]  # the calls it recorded
    callbacks: list[int]  # the host callbacks it recorded
    on_destroy: list[tuple[Any, Any]] = field(default_factory=list)  # (function, user data)


class RuntimeGraphs:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    connection: Connection
    callbacks: HostCallbacks
    capture_modes: CaptureModes
    models: dict[int, Model]
    capturing: dict[int, tuple[int, bool]]  # origin stream -> (its model, made by the capture)
    model_tasks: dict[int, tuple[int, int]]  # listed task -> (aclmdlRITaskType, position)
    bound_streams: dict[int, int]  # stream -> the built model it is bound to
    stream_models: dict[int, int]  # listed model stream -> its model
    task_models: dict[int, int]  # listed task -> its model
    task_args: dict[int, ctypes.Array]  # model task -> its arguments read back
    unready: dict[int, str]  # model -> why it does not replay (client/runtime_task_groups.py)
    signals: StreamSignals | None  # the streams' completion signals (client/fast_path.py)

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def stream(self, handle: int) -> int: ...
        def _not_sub_model(self, model: int) -> None: ...
        def _forget_sub_models(self, model: int) -> None: ...

    def _model(self, handle: int) -> Model:
        if not handle:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "modelRI is null")
        model = self.models.get(handle)
        if model is None:
            raise bad_handle("model run instance", handle)
        return model

    def _replayable(self, handle: int) -> Model:
        """The model, not being captured (107026) and not left unready by changes of its
        tasks (507011); not a sub model of a cond task (207000)."""
        model = self._model(handle)
        self._not_sub_model(handle)
        if any(handle == captured for captured, _ in self.capturing.values()):
            raise NpuError(
                codes.ACL_ERROR_RT_MODEL_CAPTURED,
                "the model is being captured (aclmdlRICaptureEnd it first)",
            )
        if handle in self.unready:
            raise NpuError(codes.ACL_ERROR_RT_MODEL_EXECUTE, self.unready[handle])
        return model

    def add_model(self, handle: int) -> None:
        """Model run instance `handle` is this process's from now on. From now on event calls
        and device synchronize ask the daemon: replays run tasks and record events that
        the call log does not show."""
        self.models[handle] = Model([], [])
        if self.signals is not None:
            self.signals.models = True

    # ---- capture -------------------------------------------------------------------------------
    @records_errors
    def capture_begin(self, stream: int, mode: int, model: int = 0) -> None:
        """aclmdlRICaptureBegin (a new model) / aclmdlRICaptureToModelRIBegin (`model`):
        the stream's tasks are recorded from now on. 107026 if the model was ever captured
        (or built), else 107027 if the stream is being captured already."""
        if mode not in MODES:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"mode {mode}: use an aclmdlRICaptureMode"
            )
        if model:
            self._model(model)
        handle = self.stream(stream)
        reply = self._call(pb.CaptureBeginRequest(stream=handle, mode=mode, model=model))
        self.capture_modes.begun(handle, mode)
        if not model:  # a new model: known from now on (aclmdlRICaptureGetInfo returns it)
            self.add_model(reply.model)
        self.capturing[handle] = (reply.model, not model)

    @records_errors
    def capture_end(self, stream: int) -> int:
        """aclmdlRICaptureEnd: the model. 107029 not in capture, 107036 begun on another
        stream; 107038 (another thread, mode not RELAXED), 507903 (invalidated) and 107025
        (a stream pulled in was not joined) end the capture without a model. Blocks."""
        handle = self.stream(stream)
        wrong_thread = self.capture_modes.wrong_thread(handle)
        try:
            reply = self._call(pb.CaptureEndRequest(stream=handle, wrong_thread=wrong_thread))
        except NpuError as error:
            if error.code not in (
                codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
                codes.ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
            ):  # the capture is over, and a model it made is gone with it
                self.capture_modes.ended(handle)
                made, new = self.capturing.pop(handle, (0, False))
                if new:
                    self.models.pop(made, None)
                    self._forget_sub_models(made)
            raise
        self.capture_modes.ended(handle)
        self.capturing.pop(handle, None)
        model = self.models[reply.model]
        model.seqs += reply.seqs
        model.callbacks += reply.callbacks
        self.connection.keep_sites(reply.seqs)
        self.callbacks.keep(reply.callbacks)
        self.connection.expect_notice(-len(reply.callbacks))  # they were not run
        return reply.model

    @records_errors
    def capture_get_info(self, stream: int) -> tuple[int, int]:
        """aclmdlRICaptureGetInfo: (aclmdlRICaptureStatus, the model being captured or 0)."""
        reply = self._call(pb.CaptureInfoRequest(stream=self.stream(stream)))
        return reply.status, reply.model

    @records_errors
    def capture_thread_exchange_mode(self, mode: int) -> int:
        """aclmdlRICaptureThreadExchangeMode: this thread's capture mode becomes `mode`; the
        old one is returned. Host only."""
        if mode not in MODES:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"mode {mode}: use an aclmdlRICaptureMode"
            )
        return self.capture_modes.exchange(mode)

    # ---- replays -------------------------------------------------------------------------------
    @records_errors
    def model_execute_async(self, model: int, stream: int) -> None:
        """aclmdlRIExecuteAsync (async): one command replays the whole graph on `stream`."""
        callbacks = len(self._replayable(model).callbacks)
        handle = self.stream(stream)
        if callbacks:
            self.connection.expect_notice(callbacks)
        self.connection.send_command(
            commands.ReplayModel.pack(model, handle), caller_site(), handle
        )

    @records_errors
    def model_execute(self, model: int, timeout: int) -> None:
        """aclmdlRIExecute: replay and wait up to `timeout` ms (-1 forever). Blocks."""
        callbacks = len(self._replayable(model).callbacks)
        if callbacks:
            self.connection.expect_notice(callbacks)
        self._call(pb.ModelExecuteRequest(model=model, timeout_ms=timeout))

    @records_errors
    def model_abort(self, model: int) -> None:
        """aclmdlRIAbort: its running replays end (507023 at their streams' next synchronize)."""
        self._model(model)
        self._call(pb.ModelAbortRequest(model=model))

    @records_errors
    def model_destroy(self, model: int) -> None:
        """aclmdlRIDestroy: 107026 while captured; waits up to 10 s for running replays
        (then 107037). Its destroy callbacks run here. Blocks."""
        kept = self._model(model)
        self._call(pb.ModelDestroyRequest(model=model))
        del self.models[model]
        self._forget_sub_models(model)
        for stream in [s for s, bound in self.bound_streams.items() if bound == model]:
            del self.bound_streams[stream]  # a built model's streams are unbound with it
        self.unready.pop(model, None)
        for task in [t for t, owner in self.task_models.items() if owner == model]:
            del self.task_models[task]  # its listed tasks and streams go with it
            self.model_tasks.pop(task, None)
            self.task_args.pop(task, None)
        for stream in [s for s, owner in self.stream_models.items() if owner == model]:
            del self.stream_models[stream]
        self.connection.forget_sites(kept.seqs)
        self.callbacks.forget(kept.callbacks)
        for function, data in kept.on_destroy:
            function(data)

    @records_errors
    def model_destroy_register_callback(self, model: int, function: Any, data: Any) -> None:
        """aclmdlRIDestroyRegisterCallback: `function(data)` runs when the model is destroyed."""
        kept = self._model(model)
        self._not_sub_model(model)
        if function is None:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "func is null")
        kept.on_destroy.append((function, data))

    @records_errors
    def model_destroy_unregister_callback(self, model: int, function: Any) -> None:
        """aclmdlRIDestroyUnregisterCallback: 100000 if `function` is not registered."""
        kept = self._model(model)
        self._not_sub_model(model)
        for index, (registered, _) in enumerate(kept.on_destroy):
            if registered == function:
                del kept.on_destroy[index]
                return
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM, "func is not a destroy callback of this model"
        )

    # ---- introspection -------------------------------------------------------------------------
    def _info(self, model: int, name: str | None = None) -> pb.ModelInfoReply:
        self._model(model)
        return self._call(pb.ModelInfoRequest(model=model, name=name))

    @records_errors
    def model_get_id(self, model: int) -> int:
        """aclmdlRIGetId: the model's id, unique in the daemon."""
        return self._info(model).id

    @records_errors
    def model_set_name(self, model: int, name: str) -> None:
        """aclmdlRISetName."""
        if name is None:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "name is null")
        self._info(model, name)

    @records_errors
    def model_get_name(self, model: int, max_len: int) -> str:
        """aclmdlRIGetName: the name, 100000 if it does not fit `max_len` bytes with its
        terminating NUL."""
        name = self._info(model).name
        if max_len <= len(name.encode()):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"maxLen {max_len} is too small for the name ({len(name.encode())} bytes + NUL)",
            )
        return name

    @records_errors
    def model_get_streams(self, model: int) -> list[int]:
        """aclmdlRIGetStreams: the model's streams, the capture's origin first (207000 for a
        sub model of a cond task)."""
        self._model(model)
        self._not_sub_model(model)
        streams = list(self._info(model).streams)
        for stream in streams:
            self.stream_models[stream] = model
        return streams

    @records_errors
    def model_get_tasks_by_stream(self, stream: int) -> list[int]:
        """aclmdlRIGetTasksByStream: the tasks of a model's stream, in stream order."""
        if not stream:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "stream is null")
        reply = self._call(pb.ModelTasksRequest(stream=stream))
        for task in reply.tasks:
            self.model_tasks[task.handle] = (task.type, task.seq_id)
            self.task_models[task.handle] = self.stream_models.get(stream, 0)
        return [task.handle for task in reply.tasks]

    def _task(self, task: int) -> tuple[int, int]:
        if not task:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "task is null")
        found = self.model_tasks.get(task)
        if found is None:
            raise bad_handle("model task", task)
        return found

    @records_errors
    def model_task_get_type(self, task: int) -> int:
        """aclmdlRITaskGetType: its aclmdlRITaskType. Host only."""
        return self._task(task)[0]

    @records_errors
    def model_task_get_seq_id(self, task: int) -> int:
        """aclmdlRITaskGetSeqId: its position in its stream, from 0. Host only."""
        return self._task(task)[1]

    @records_errors
    def model_debug_json(self, model: int, flags: int) -> str:
        """The graph as JSON (aclmdlRIDebugPrint, aclmdlRIDebugJsonPrint)."""
        self._model(model)
        if flags not in (
            codes.ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY,
            codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE,
        ):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"flags {flags}: use ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY or _VERBOSE",
            )
        return self._call(pb.ModelDumpRequest(model=model, flags=flags)).json

    @records_errors
    def model_debug_json_print(self, model: int, path: str, flags: int) -> None:
        """aclmdlRIDebugJsonPrint: write the graph as JSON to `path`."""
        if not path:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "path is null")
        text = self.model_debug_json(model, flags)
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as error:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"cannot write {path}: {error.strerror}"
            ) from None

    @records_errors
    def model_debug_print(self, model: int) -> None:
        """aclmdlRIDebugPrint: the graph, every task, on stdout."""
        print(self.model_debug_json(model, codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE), flush=True)
