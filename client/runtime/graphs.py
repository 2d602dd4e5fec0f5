"""rt.graphs: model run instances (aclmdlRI) -- graph capture and replay, destroy
callbacks, introspection and debug output, and cond tasks (aclmdlRICondHandleCreate,
aclmdlRICondHandleGetCondPtr, aclmdlRIAddCondTask). docs/graph-capture.md is the design; the
capture state, the graphs, the conditions and their sub models are the daemon's
(server/graphs/capture.py, server/graphs/cond_handles.py). Explicitly built models and task groups
are the sub-parts rt.model_build and rt.task_groups, which reach the models through the calls here.

What the host keeps of a model: the calls it recorded (their call sites, so a replay's
failure names where its task was captured), the host callbacks it recorded (each replay runs
them again), its destroy callbacks, the types and positions of the tasks listed by
aclmdlRIGetTasksByStream, why it does not replay (its tasks were changed), each condition's
model and device address, and each sub model's parent (the model its cond task belongs to),
so that sub models are refused where the runtime refuses them and go with their model.
Whether a capture runs and whether a model was ever made is told to the synchronization part
(the streams' signals decide less then).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from simnpu.client.capture_modes import MODES
from simnpu.client.last_error import records_errors
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, bad_handle, invalid
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.client.runtime.callbacks import HostCallbacks
    from simnpu.client.runtime.shared import Shared
    from simnpu.client.runtime.synchronization import Synchronization

_TYPES = (
    codes.ACL_MODEL_RI_COND_TYPE_IF,
    codes.ACL_MODEL_RI_COND_TYPE_WHILE,
    codes.ACL_MODEL_RI_COND_TYPE_SWITCH,
)
_UINT32 = 1 << 32
T = TypeVar("T")


@dataclass
class Model:
    """What this process keeps of a model run instance."""

    seqs: list[int]  # the calls it recorded
    callbacks: list[int]  # the host callbacks it recorded
    on_destroy: list[tuple[Any, Any]] = field(default_factory=list)  # (function, user data)


class Graphs:
    """Model run instance calls (see the module docstring)."""

    def __init__(self, shared: Shared, callbacks: HostCallbacks, sync: Synchronization):
        self._calls, self._connection = shared.calls, shared.connection
        self._contexts, self._allocations = shared.contexts, shared.allocations
        self._capture_modes = shared.capture_modes
        self._callbacks, self._sync = callbacks, sync
        self._models: dict[int, Model] = {}  # model run instances (aclmdlRI) of this process
        self._models_made = False  # ever: replays run tasks the call log does not show
        self._capturing: dict[int, tuple[int, bool]] = {}  # stream -> (model, made by capture)
        self._model_tasks: dict[int, tuple[int, int]] = {}  # listed task -> (type, position)
        self._task_models: dict[int, int] = {}  # listed model task -> its model
        self._task_args: dict[int, ctypes.Array] = {}  # model task -> its arguments read back
        self._stream_models: dict[int, int] = {}  # listed model stream -> its model
        self._unready: dict[int, str] = {}  # model -> why it does not replay
        self._conditions: dict[int, tuple[int, int]] = {}  # condition -> (model, address)
        self._sub_models: dict[int, int] = {}  # sub model of a cond task -> that task's model

    def _tell_sync(self) -> None:
        self._sync.graphs_changed(bool(self._capturing), self._models_made)

    # ---- the models, for this part and its sub-parts -------------------------------------------
    def model(self, handle: int) -> Model:
        """What this process keeps of model `handle` (100000 for null, 107017 for a handle
        that is not a model of this process)."""
        return _held(self._models, handle, "modelRI", "model run instance")

    def _replayable(self, handle: int) -> Model:
        """The model, not being captured (107026) and not left unready by changes of its
        tasks (507011); not a sub model of a cond task (207000)."""
        model = self.model(handle)
        self._not_sub_model(handle)
        if any(handle == captured for captured, _ in self._capturing.values()):
            raise NpuError(
                codes.ACL_ERROR_RT_MODEL_CAPTURED,
                "the model is being captured (aclmdlRICaptureEnd it first)",
            )
        if handle in self._unready:
            raise NpuError(codes.ACL_ERROR_RT_MODEL_EXECUTE, self._unready[handle])
        return model

    def add_model(self, handle: int) -> None:
        """Model run instance `handle` is this process's from now on. From now on event calls
        and device synchronize ask the daemon: replays run tasks and record events that
        the call log does not show."""
        self._models[handle] = Model([], [])
        self._models_made = True
        self._tell_sync()

    def keep_recorded(self, handle: int, seqs: list[int], callbacks: list[int]) -> None:
        """Model `handle` recorded the calls `seqs` and the host callbacks `callbacks` (those
        it holds already are not added again): their sites are kept while it lives, and the
        callbacks run at each replay, not now."""
        kept = self._models[handle]
        new_seqs = [seq for seq in seqs if seq not in set(kept.seqs)]
        new_callbacks = [c for c in callbacks if c not in set(kept.callbacks)]
        kept.seqs += new_seqs
        kept.callbacks += new_callbacks
        self._connection.keep_sites(new_seqs)
        self._callbacks.keep(new_callbacks)
        self._connection.expect_notice(-len(new_callbacks))  # they were not run

    def task_model(self, task: int) -> int:
        """The model of a task listed by aclmdlRIGetTasksByStream (0: not known)."""
        return self._task_models.get(task, 0)

    def keep_task_args(self, task: int, buffer: ctypes.Array) -> None:
        """The host copy of a kernel task's arguments read back (aclmdlRITaskGetParams),
        kept until the next read of that task or the end of its model."""
        self._task_args[task] = buffer

    def tasks_changed(self, task: int, failed: bool) -> None:
        """A change of `task` was made (`failed`: the daemon refused it with 107000): its
        model does not replay until aclmdlRIUpdate (a failed change faults it for good)."""
        model = self._task_models.get(task, 0)
        if not model:
            return
        if failed:
            self._unready[model] = "a change of the model's tasks failed (destroy it)"
        elif model not in self._unready:
            self._unready[model] = "the model's tasks were changed (aclmdlRIUpdate first)"

    def updated(self, model: int) -> None:
        """aclmdlRIUpdate made the model's changed tasks take effect: it replays again."""
        self._unready.pop(model, None)

    # ---- capture -------------------------------------------------------------------------------
    @records_errors
    def capture_begin(
        self, stream: int, mode: int, model: int = 0, site: str | None = None
    ) -> None:
        """aclmdlRICaptureBegin (a new model) / aclmdlRICaptureToModelRIBegin (`model`):
        the stream's tasks are recorded from now on. 107026 if the model was ever captured
        (or built), else 107027 if the stream is being captured already. Blocks."""
        if mode not in MODES:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"mode {mode}: use an aclmdlRICaptureMode"
            )
        if model:
            self.model(model)
        handle = self._contexts.stream(stream)
        request = pb.CaptureBeginRequest(stream=handle, mode=mode, model=model)
        reply = self._calls.request(request, site)
        self._capture_modes.begun(handle, mode)
        if not model:  # a new model: known from now on (aclmdlRICaptureGetInfo returns it)
            self.add_model(reply.model)
        self._capturing[handle] = (reply.model, not model)
        self._tell_sync()

    @records_errors
    def capture_end(self, stream: int, site: str | None = None) -> int:
        """aclmdlRICaptureEnd: the model. 107029 not in capture, 107036 begun on another
        stream; 107038 (another thread, mode not RELAXED), 507903 (invalidated) and 107025
        (a stream pulled in was not joined) end the capture without a model. Blocks."""
        handle = self._contexts.stream(stream)
        wrong_thread = self._capture_modes.wrong_thread(handle)
        try:
            request = pb.CaptureEndRequest(stream=handle, wrong_thread=wrong_thread)
            reply = self._calls.request(request, site)
        except NpuError as error:
            if error.code not in (
                codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
                codes.ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED,
            ):  # the capture is over, and a model it made is gone with it
                self._capture_modes.ended(handle)
                made, new = self._capturing.pop(handle, (0, False))
                self._tell_sync()
                if new:
                    self._models.pop(made, None)
                    self._forget_sub_models(made)
            raise
        self._capture_modes.ended(handle)
        self._capturing.pop(handle, None)
        self._tell_sync()
        self.keep_recorded(reply.model, list(reply.seqs), list(reply.callbacks))
        return reply.model

    @records_errors
    def capture_get_info(self, stream: int, site: str | None = None) -> tuple[int, int]:
        """aclmdlRICaptureGetInfo: (aclmdlRICaptureStatus, the model being captured or 0).
        Blocks."""
        request = pb.CaptureInfoRequest(stream=self._contexts.stream(stream))
        reply = self._calls.request(request, site)
        return reply.status, reply.model

    @records_errors
    def capture_thread_exchange_mode(self, mode: int) -> int:
        """aclmdlRICaptureThreadExchangeMode: this thread's capture mode becomes `mode`; the
        old one is returned. Host only."""
        if mode not in MODES:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"mode {mode}: use an aclmdlRICaptureMode"
            )
        return self._capture_modes.exchange(mode)

    # ---- replays -------------------------------------------------------------------------------
    @records_errors
    def model_execute_async(self, model: int, stream: int, site: str | None = None) -> None:
        """aclmdlRIExecuteAsync (async): one command replays the whole graph on `stream`."""
        callbacks = len(self._replayable(model).callbacks)
        handle = self._contexts.stream(stream)
        if callbacks:
            self._connection.expect_notice(callbacks)
        self._calls.command(commands.ReplayModel.pack(model, handle), handle, site)

    @records_errors
    def model_execute(self, model: int, timeout: int, site: str | None = None) -> None:
        """aclmdlRIExecute: replay and wait up to `timeout` ms (-1 forever). Blocks."""
        callbacks = len(self._replayable(model).callbacks)
        if callbacks:
            self._connection.expect_notice(callbacks)
        self._calls.request(pb.ModelExecuteRequest(model=model, timeout_ms=timeout), site)

    @records_errors
    def model_abort(self, model: int, site: str | None = None) -> None:
        """aclmdlRIAbort: its running replays end (507023 at their streams' next
        synchronize). Blocks."""
        self.model(model)
        self._calls.request(pb.ModelAbortRequest(model=model), site)

    @records_errors
    def model_destroy(self, model: int, site: str | None = None) -> None:
        """aclmdlRIDestroy: 107026 while captured; waits up to 10 s for running replays
        (then 107037). Its destroy callbacks run here. Blocks."""
        kept = self.model(model)
        self._calls.request(pb.ModelDestroyRequest(model=model), site)
        del self._models[model]
        self._forget_sub_models(model)
        for record in list(self._contexts.streams.values()):
            if record.bound_model == model:
                record.bound_model = 0  # a built model's streams are unbound with it
        self._unready.pop(model, None)
        for task in [t for t, owner in self._task_models.items() if owner == model]:
            del self._task_models[task]  # its listed tasks and streams go with it
            self._model_tasks.pop(task, None)
            self._task_args.pop(task, None)
        for stream in [s for s, owner in self._stream_models.items() if owner == model]:
            del self._stream_models[stream]
        self._connection.forget_sites(kept.seqs)
        self._callbacks.forget(kept.callbacks)
        for function, data in kept.on_destroy:
            function(data)

    @records_errors
    def model_destroy_register_callback(self, model: int, function: Any, data: Any) -> None:
        """aclmdlRIDestroyRegisterCallback: `function(data)` runs when the model is destroyed."""
        kept = self.model(model)
        self._not_sub_model(model)
        if function is None:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "func is null")
        kept.on_destroy.append((function, data))

    @records_errors
    def model_destroy_unregister_callback(self, model: int, function: Any) -> None:
        """aclmdlRIDestroyUnregisterCallback: 100000 if `function` is not registered."""
        kept = self.model(model)
        self._not_sub_model(model)
        for index, (registered, _) in enumerate(kept.on_destroy):
            if registered == function:
                del kept.on_destroy[index]
                return
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM, "func is not a destroy callback of this model"
        )

    # ---- introspection -------------------------------------------------------------------------
    def _info(self, model: int, name: str | None, site: str | None) -> pb.ModelInfoReply:
        self.model(model)
        return self._calls.request(pb.ModelInfoRequest(model=model, name=name), site)

    @records_errors
    def model_get_id(self, model: int, site: str | None = None) -> int:
        """aclmdlRIGetId: the model's id, unique in the daemon. Blocks."""
        return self._info(model, None, site).id

    @records_errors
    def model_set_name(self, model: int, name: str, site: str | None = None) -> None:
        """aclmdlRISetName. Blocks."""
        if name is None:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "name is null")
        self._info(model, name, site)

    @records_errors
    def model_get_name(self, model: int, max_len: int, site: str | None = None) -> str:
        """aclmdlRIGetName: the name, 100000 if it does not fit `max_len` bytes with its
        terminating NUL. Blocks."""
        name = self._info(model, None, site).name
        if max_len <= len(name.encode()):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"maxLen {max_len} is too small for the name ({len(name.encode())} bytes + NUL)",
            )
        return name

    @records_errors
    def model_get_streams(self, model: int, site: str | None = None) -> list[int]:
        """aclmdlRIGetStreams: the model's streams, the capture's origin first (207000 for a
        sub model of a cond task). Blocks."""
        self.model(model)
        self._not_sub_model(model)
        streams = list(self._info(model, None, site).streams)
        for stream in streams:
            self._stream_models[stream] = model
        return streams

    @records_errors
    def model_get_tasks_by_stream(self, stream: int, site: str | None = None) -> list[int]:
        """aclmdlRIGetTasksByStream: the tasks of a model's stream, in stream order. Blocks."""
        if not stream:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "stream is null")
        reply = self._calls.request(pb.ModelTasksRequest(stream=stream), site)
        for task in reply.tasks:
            self._model_tasks[task.handle] = (task.type, task.seq_id)
            self._task_models[task.handle] = self._stream_models.get(stream, 0)
        return [task.handle for task in reply.tasks]

    def _task(self, task: int) -> tuple[int, int]:
        return _held(self._model_tasks, task, "task", "model task")

    @records_errors
    def model_task_get_type(self, task: int) -> int:
        """aclmdlRITaskGetType: its aclmdlRITaskType. Host only."""
        return self._task(task)[0]

    @records_errors
    def model_task_get_seq_id(self, task: int) -> int:
        """aclmdlRITaskGetSeqId: its position in its stream, from 0. Host only."""
        return self._task(task)[1]

    @records_errors
    def model_debug_json(self, model: int, flags: int, site: str | None = None) -> str:
        """The graph as JSON (aclmdlRIDebugPrint, aclmdlRIDebugJsonPrint). Blocks."""
        self.model(model)
        if flags not in (
            codes.ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY,
            codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE,
        ):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"flags {flags}: use ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY or _VERBOSE",
            )
        return self._calls.request(pb.ModelDumpRequest(model=model, flags=flags), site).json

    @records_errors
    def model_debug_json_print(
        self, model: int, path: str, flags: int, site: str | None = None
    ) -> None:
        """aclmdlRIDebugJsonPrint: write the graph as JSON to `path`. Blocks."""
        if not path:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "path is null")
        text = self.model_debug_json(model, flags, site)
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as error:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"cannot write {path}: {error.strerror}"
            ) from None

    @records_errors
    def model_debug_print(self, model: int, site: str | None = None) -> None:
        """aclmdlRIDebugPrint: the graph, every task, on stdout. Blocks."""
        text = self.model_debug_json(model, codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE, site)
        print(text, flush=True)

    # ---- cond tasks ----------------------------------------------------------------------------
    @records_errors
    def cond_handle_create(
        self, model: int, default_value: int, flag: int, site: str | None = None
    ) -> int:
        """aclmdlRICondHandleCreate: a condition (a uint64 in device memory, 0 at first) of a
        model being captured. 107000 for another flag than 0 or ASSIGN_DEFAULT or a model not
        in the capture stage, 207000 for a built model. Blocks."""
        if not model:
            raise _null("modelRI")
        if not 0 <= default_value < _UINT32:
            raise invalid(f"defaultLaunchValue {default_value} is not a uint32")
        if not 0 <= flag < _UINT32:
            raise invalid(f"flag {flag}: use 0 or ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT")
        request = pb.CondHandleCreateRequest(model=model, default_value=default_value, flag=flag)
        reply = self._calls.request(request, site)
        self._conditions[reply.handle] = (model, reply.pointer)
        # usable by copies and kernels as any block of this process, until the model goes
        self._allocations.remember(reply.pointer, 8, split_device_address(reply.pointer)[0])
        return reply.handle

    @records_errors
    def cond_handle_get_cond_ptr(self, handle: int) -> int:
        """aclmdlRICondHandleGetCondPtr: the device address of the condition's uint64. Host
        only."""
        if not handle:
            raise _null("handle")
        found = self._conditions.get(handle)
        if found is None:
            raise bad_handle("condition", handle)
        return found[1]

    @records_errors
    def add_cond_task(
        self, params: Any, stream: int, flags: int, site: str | None = None
    ) -> list[int]:
        """aclmdlRIAddCondTask: a cond task recorded on the capturing stream; its new sub
        models, in branch order. 107000 for a type out of range, flags not 0, a null handle,
        a handle used already, a size the type does not take or a stream captured into
        another model; 107029 for a stream not in capture. Blocks."""
        if not stream:
            raise _null("stream")
        if not isinstance(params, dict):
            raise _null("params")
        kind, size, handle = params.get("type"), params.get("size"), params.get("handle")
        if not isinstance(kind, int) or kind not in _TYPES:
            raise invalid(f"params.type {kind!r}: use an aclmdlRICondTaskType")
        if flags:
            raise invalid(f"flags {flags}: reserved, must be 0")
        if not handle:
            raise invalid("params.handle is null")
        if not isinstance(handle, int):
            raise invalid(f"params.handle {handle!r} is not a condition handle")
        if not isinstance(size, int) or not 0 <= size < _UINT32:
            raise invalid(f"params.size {size!r} is not a uint32")
        request = pb.AddCondTaskRequest(
            stream=self._contexts.stream(stream), handle=handle, type=kind, size=size
        )
        reply = self._calls.request(request, site)
        model = self._conditions[handle][0] if handle in self._conditions else 0
        for sub in reply.sub_models:
            self.add_model(sub)
            self._sub_models[sub] = model
        return list(reply.sub_models)

    def _not_sub_model(self, model: int) -> None:
        """207000 for a sub model of a cond task, where the runtime refuses one (it runs, and
        goes, only with the model of its cond task)."""
        if model in self._sub_models:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "a sub model of a cond task does not support this call (use its model's)",
            )

    def _forget_sub_models(self, model: int) -> None:
        """`model` is gone: its conditions and the sub models of its cond tasks go too."""
        for handle in [h for h, (owner, _) in self._conditions.items() if owner == model]:
            _, address = self._conditions.pop(handle)
            with self._allocations.lock:
                if self._allocations.holds(address):  # (unless the program freed it)
                    self._allocations.forget(address)
        for sub in [s for s, parent in self._sub_models.items() if parent == model]:
            del self._sub_models[sub]
            for stream in [s for s, (captured, _) in self._capturing.items() if captured == sub]:
                del self._capturing[stream]  # its capture ended with it
                self._capture_modes.ended(stream)
                self._tell_sync()
            kept = self._models.pop(sub, None)
            self._unready.pop(sub, None)
            if kept is not None:
                self._connection.forget_sites(kept.seqs)
                self._callbacks.forget(kept.callbacks)
            self._forget_sub_models(sub)


def _null(name: str) -> NpuError:
    """ACL's own null check (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{name} is null")


def _held(table: dict[int, T], handle: int, name: str, kind: str) -> T:
    """table[handle]: 100000 for a null `name`, 107017 for a handle of no `kind` of this
    process."""
    if not handle:
        raise _null(name)
    found = table.get(handle)
    if found is None:
        raise bad_handle(kind, handle)
    return found
