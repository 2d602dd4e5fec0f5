"""acl.mdl: model run instances (aclmdlRI) -- stream capture into a graph and its replay
(client/runtime/graphs.py, server/graphs/capture.py; docs/graph-capture.md).

Written like acl.rt: pyACL's argument checks and return shapes, the ACL code last; handles
(models, model streams, model tasks) are ints. Offline models (.om files: load, execute,
descriptions, datasets) are not simulated: those calls return 207000 and say why.
"""

from __future__ import annotations

from simnpu.client.facade import api, not_supported
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes as _codes
from simnpu.proto.errors import NpuError as _NpuError

from . import mdl_cond as _cond
from . import mdl_updates as _updates


# ---- capture ------------------------------------------------------------------------------------
@api("ki")
def ri_capture_begin(rt, stream, mode, *, site):
    """aclmdlRICaptureBegin: the stream's tasks are recorded into a new model from now on.
    107027 if it is being captured already; 100000 for an unknown mode. Blocks."""
    rt.graphs.capture_begin(stream, mode, site=site)


@api("kki")
def ri_capture_to_model_ri_begin(rt, stream, model_ri, mode, *, site):
    """aclmdlRICaptureToModelRIBegin: as ri_capture_begin, into `model_ri`, which must never
    have been captured -- a sub model of ri_add_cond_task (107026 otherwise). Blocks."""
    if not model_ri:
        raise _null("modelRI")
    rt.graphs.capture_begin(stream, mode, model_ri, site=site)


@api("k", (0,))
def ri_capture_end(rt, stream, *, site):
    """aclmdlRICaptureEnd: `model_ri, ret`. 107029 not in capture, 107036 begun on another
    stream, 107025 a stream pulled in was not joined back, 507903 invalidated, 107038 from
    another thread (mode not RELAXED). Blocks."""
    return rt.graphs.capture_end(stream, site=site)


@api("k", (0, 0))
def ri_capture_get_info(rt, stream, *, site):
    """aclmdlRICaptureGetInfo: `status, model_ri, ret` -- ACL_MODEL_RI_CAPTURE_STATUS_NONE,
    _ACTIVE or _INVALIDATED, and the model being captured (0 when none)."""
    return rt.graphs.capture_get_info(stream, site=site)


@api("i", (0,))
def ri_capture_thread_exchange_mode(rt, mode):
    """aclmdlRICaptureThreadExchangeMode: `old_mode, ret`; this thread's mode becomes `mode`.
    Host only."""
    return rt.graphs.capture_thread_exchange_mode(mode)


# ---- replays ------------------------------------------------------------------------------------
@api("kk")
def ri_execute_async(rt, model_ri, stream, *, site):
    """aclmdlRIExecuteAsync (async): replay the whole graph on `stream`, one command."""
    rt.graphs.model_execute_async(model_ri, stream, site=site)


@api("ki")
def ri_execute(rt, model_ri, timeout, *, site):
    """aclmdlRIExecute: replay and wait up to `timeout` ms (-1 forever; 507046 after it).
    Blocks."""
    rt.graphs.model_execute(model_ri, timeout, site=site)


@api("k")
def ri_abort(rt, model_ri, *, site):
    """aclmdlRIAbort: the model's running replays end; their streams' next synchronize
    reports 507023."""
    rt.graphs.model_abort(model_ri, site=site)


@api("k")
def ri_destroy(rt, model_ri, *, site):
    """aclmdlRIDestroy: 107026 while captured; waits up to 10 s for its running replays,
    then 107037. Runs its destroy callbacks. Blocks."""
    rt.graphs.model_destroy(model_ri, site=site)


@api("kCO")
def ri_destroy_register_callback(rt, model_ri, func, user_data):
    """aclmdlRIDestroyRegisterCallback: func(user_data) runs when the model is destroyed."""
    rt.graphs.model_destroy_register_callback(model_ri, func, user_data)


@api("kC")
def ri_destroy_unregister_callback(rt, model_ri, func):
    """aclmdlRIDestroyUnregisterCallback: 100000 if func is not registered."""
    rt.graphs.model_destroy_unregister_callback(model_ri, func)


# ---- introspection ------------------------------------------------------------------------------
@api("k", (0,))
def ri_get_id(rt, model_ri, *, site):
    """aclmdlRIGetId: `model_ri_id, ret`, unique in the daemon."""
    return rt.graphs.model_get_id(model_ri, site=site)


@api("ks")
def ri_set_name(rt, model_ri, name, *, site):
    """aclmdlRISetName."""
    rt.graphs.model_set_name(model_ri, name, site=site)


@api("ki", ("",))
def ri_get_name(rt, model_ri, max_len, *, site):
    """aclmdlRIGetName: `name, ret`; 100000 if it does not fit max_len bytes with its NUL."""
    return rt.graphs.model_get_name(model_ri, max_len, site=site)


@api("k", ([],))
def ri_get_streams(rt, model_ri, *, site):
    """aclmdlRIGetStreams: `streams, ret`, the capture's origin first (model streams, for
    ri_get_tasks_by_stream)."""
    return rt.graphs.model_get_streams(model_ri, site=site)


@api("k", ([],))
def ri_get_tasks_by_stream(rt, stream, *, site):
    """aclmdlRIGetTasksByStream: `tasks, ret` of a model stream, in stream order."""
    return rt.graphs.model_get_tasks_by_stream(stream, site=site)


@api("k", (0,))
def ri_task_get_type(rt, task):
    """aclmdlRITaskGetType: `type, ret` (aclmdlRITaskType). Host only."""
    return rt.graphs.model_task_get_type(task)


@api("k", (0,))
def ri_task_get_seq_id(rt, task):
    """aclmdlRITaskGetSeqId: `id, ret`, the task's position in its stream. Host only."""
    return rt.graphs.model_task_get_seq_id(task)


@api("k")
def ri_debug_print(rt, model_ri, *, site):
    """aclmdlRIDebugPrint (deprecated: ri_debug_json_print): the graph as JSON on stdout."""
    rt.graphs.model_debug_print(model_ri, site=site)


@api("kpi")
def ri_debug_json_print(rt, model_ri, path, flags, *, site):
    """aclmdlRIDebugJsonPrint: the graph as JSON in the file `path` (every task with
    ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE, a count per stream with _SUMMARY)."""
    rt.graphs.model_debug_json_print(model_ri, path, flags, site=site)


# ---- explicit building (client/runtime/model_build.py, docs/model-build.md) --------------------
@api("i", (0,))
def ri_build_begin(rt, flag, *, site):
    """aclmdlRIBuildBegin: `model_ri, ret`, a new model of the current context to bind
    persistent streams to; flag is reserved (0, else 107000)."""
    return rt.model_build.model_build_begin(flag, site=site)


@api("kkI")
def ri_bind_stream(rt, model_ri, stream, flag, *, site):
    """aclmdlRIBindStream: the stream's tasks are recorded into the model from now on.
    ACL_MODEL_STREAM_FLAG_HEAD: it runs when a replay starts; _DEFAULT: when a task of the
    model activates it. 107000 for a captured model or a stream without
    ACL_STREAM_PERSISTENT, 107005 if it is bound already, 107027 in capture. Blocks."""
    rt.model_build.model_bind_stream(model_ri, stream, flag, False, site=site)


@api("kk")
def ri_end_task(rt, model_ri, stream, *, site):
    """aclmdlRIEndTask: the end-of-graph task on a bound stream (107005 if not bound to
    the model). Blocks."""
    rt.model_build.model_end_task(model_ri, stream, site=site)


@api("kO")
def ri_build_end(rt, model_ri, reserve, *, site):
    """aclmdlRIBuildEnd: the model may be replayed; reserve must be None or 0 (100000). 207000 if
    a label jump goes backwards or to another stream (not simulated). Blocks."""
    rt.model_build.model_build_end(model_ri, reserve, site=site)


@api("kk")
def ri_unbind_stream(rt, model_ri, stream, *, site):
    """aclmdlRIUnbindStream: the stream runs its tasks again (107005 if it is not bound to
    the model). Blocks."""
    rt.model_build.model_bind_stream(model_ri, stream, 0, True, site=site)


def _null(name: str) -> _NpuError:
    return _NpuError(_codes.ACL_ERROR_INVALID_PARAM, f"{name} is null")


# ---- not supported ------------------------------------------------------------------------------
_OM = (
    "offline models (.om files) are not simulated: there is no model compiler or loader; "
    "capture a graph with ri_capture_begin / ri_capture_end and replay it with ri_execute_async"
)
_DUMP = "model dumps are not simulated"

# name: (C call, values returned before ret (None: ret only), why)
_UNSUPPORTED: dict[str, tuple[str, tuple | None, str]] = {
    "init_dump": ("aclmdlInitDump", None, _DUMP),
    "set_dump": ("aclmdlSetDump", None, _DUMP),
    "finalize_dump": ("aclmdlFinalizeDump", None, _DUMP),
    "load_from_file": ("aclmdlLoadFromFile", (0,), _OM),
    "load_from_mem": ("aclmdlLoadFromMem", (0,), _OM),
    "load_from_file_with_mem": ("aclmdlLoadFromFileWithMem", (0,), _OM),
    "load_from_mem_with_mem": ("aclmdlLoadFromMemWithMem", (0,), _OM),
    "load_from_file_with_q": ("aclmdlLoadFromFileWithQ", (0,), _OM),
    "load_from_mem_with_q": ("aclmdlLoadFromMemWithQ", (0,), _OM),
    "load_with_config": ("aclmdlLoadWithConfig", (0,), _OM),
    "unload": ("aclmdlUnload", None, _OM),
    "execute": ("aclmdlExecute", None, _OM),
    "execute_async": ("aclmdlExecuteAsync", None, _OM),
    "query_size": ("aclmdlQuerySize", (0, 0), _OM),
    "query_size_from_mem": ("aclmdlQuerySizeFromMem", (0, 0), _OM),
    "get_desc": ("aclmdlGetDesc", None, _OM),
    "get_desc_from_file": ("aclmdlGetDescFromFile", None, _OM),
    "get_desc_from_mem": ("aclmdlGetDescFromMem", None, _OM),
    "set_dynamic_batch_size": ("aclmdlSetDynamicBatchSize", None, _OM),
    "set_dynamic_hw_size": ("aclmdlSetDynamicHWSize", None, _OM),
    "set_input_dynamic_dims": ("aclmdlSetInputDynamicDims", None, _OM),
    "set_input_aipp": ("aclmdlSetInputAIPP", None, _OM),
}
# C calls that return a value and no aclError: pyACL returns just that value.
_UNSUPPORTED_VALUES = {
    "create_desc": ("aclmdlCreateDesc", 0, _OM),
    "destroy_desc": ("aclmdlDestroyDesc", 0, _OM),
    "create_dataset": ("aclmdlCreateDataset", 0, _OM),
    "destroy_dataset": ("aclmdlDestroyDataset", 0, _OM),
    "add_dataset_buffer": ("aclmdlAddDatasetBuffer", 0, _OM),
    "get_dataset_buffer": ("aclmdlGetDatasetBuffer", 0, _OM),
    "get_dataset_num_buffers": ("aclmdlGetDatasetNumBuffers", 0, _OM),
    "get_num_inputs": ("aclmdlGetNumInputs", 0, _OM),
    "get_num_outputs": ("aclmdlGetNumOutputs", 0, _OM),
    "get_input_size_by_index": ("aclmdlGetInputSizeByIndex", 0, _OM),
    "get_output_size_by_index": ("aclmdlGetOutputSizeByIndex", 0, _OM),
}
UNSUPPORTED = sorted([*_UNSUPPORTED, *_UNSUPPORTED_VALUES])
for _name, (_call, _outputs, _why) in _UNSUPPORTED.items():
    globals()[_name] = not_supported(f"acl.mdl.{_name}", _call, _why, _outputs)
for _name, (_call, _value, _why) in _UNSUPPORTED_VALUES.items():
    globals()[_name] = not_supported(f"acl.mdl.{_name}", _call, _why, (_value,), returns_code=False)
del _name, _call, _outputs, _why, _value, api, not_supported

# Task groups and task changes (updates without recapture) and conditional tasks are acl.mdl
# calls too, written in client/acl/mdl_updates.py and client/acl/mdl_cond.py.
__getattr__, __dir__ = _on_demand(globals(), _updates, _cond)
