"""acl.rt error and exception calls: exception-info callbacks and their getters, the
thread's last task id, the device's verbose error info (client/exceptions.py).

Written like the rest of acl.rt (client/acl/rt.py, which offers the calls this module lists
in `__all__` as its own). A callback receives the aclrtExceptionInfo handle as an int, valid
while the callbacks run; the getters return 0xFFFFFFFF (ACL_ERROR_INVALID_EXCEPTION_INFO)
for a null or unknown handle, as the C getters do for a null pointer.
"""

from __future__ import annotations

from simnpu.client.exceptions import EXCEPTIONS as _EXCEPTIONS
from simnpu.client.exceptions import U32 as _U32
from simnpu.client.exceptions import ExceptionInfo as _ExceptionInfo
from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes
from simnpu.proto.errors import NotSupportedError as _NotSupportedError
from simnpu.proto.errors import NpuError as _NpuError

_INVALID_INFO = -1  # ACL_ERROR_INVALID_EXCEPTION_INFO (0xFFFFFFFF) as the aclError these return
_NO_LAUNCH = "the exception info is null, unknown, or not a kernel launch's"

__all__ = [
    "exception_info_callback_register",
    "exception_info_callback_unregister",
    "get_args_from_exception_info",
    "get_device_id_from_exception_info",
    "get_error_code_from_exception_info",
    "get_error_verbose",
    "get_func_handle_from_exception_info",
    "get_stream_id_from_exception_info",
    "get_task_id_from_exception_info",
    "get_thread_id_from_exception_info",
    "get_thread_last_task_id",
    "set_exception_info_callback",
]


# ---- callbacks -------------------------------------------------------------------------------
@api("O", needs_session=False)
def exception_info_callback_register(rt, callback):
    """aclrtExceptionInfoCallbackRegister: `callback(info)` runs, on a thread of its own,
    when a call (a synchronize) reports a task's failure, before that call returns; once
    per failure. Registering one twice adds nothing; 107000 for None."""
    _EXCEPTIONS.register(_callback(callback, "exception_info_callback_register"))


@api("O", needs_session=False)
def exception_info_callback_unregister(rt, callback):
    """aclrtExceptionInfoCallbackUnregister: one not registered is no error; 107000 for None."""
    _EXCEPTIONS.unregister(_callback(callback, "exception_info_callback_unregister"))


@api("O", needs_session=False)
def set_exception_info_callback(rt, callback):
    """aclrtSetExceptionInfoCallback (deprecated): the one callback of this call, run as the
    registered ones are; None removes it."""
    if callback is not None and not callable(callback):
        raise TypeError("acl.rt.set_exception_info_callback: callback must be callable or None")
    _EXCEPTIONS.set_legacy(callback)


def _callback(callback, name: str):
    if callback is None:
        raise _NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, "callback is null")
    if not callable(callback):
        raise TypeError(f"acl.rt.{name}: callback must be callable")
    return callback


# ---- the getters (C calls that return a uint32, no aclError) ---------------------------------
def _info(info) -> _ExceptionInfo | None:
    if info.__class__ is not int:
        raise TypeError(f"the exception info must be an int (a handle), not {type(info).__name__}")
    return _EXCEPTIONS.info(info)


def get_task_id_from_exception_info(info):
    """aclrtGetTaskIdFromExceptionInfo: the failed task's number (get_thread_last_task_id's)."""
    found = _info(info)
    return found.task_id if found is not None else _U32


def get_stream_id_from_exception_info(info):
    """aclrtGetStreamIdFromExceptionInfo: its stream's id (stream_get_id's)."""
    found = _info(info)
    return found.stream_id if found is not None else _U32


def get_thread_id_from_exception_info(info):
    """aclrtGetThreadIdFromExceptionInfo: the system thread id (threading.get_native_id) of
    the thread that submitted it."""
    found = _info(info)
    return found.thread_id if found is not None else _U32


def get_device_id_from_exception_info(info):
    """aclrtGetDeviceIdFromExceptionInfo: its device."""
    found = _info(info)
    return found.device_id if found is not None else _U32


def get_error_code_from_exception_info(info):
    """aclrtGetErrorCodeFromExceptionInfo: the code the failure is reported with."""
    found = _info(info)
    return found.error_code if found is not None else _U32


@api("O", ((0, 0),), needs_session=False)
def get_args_from_exception_info(rt, info):
    """aclrtGetArgsFromExceptionInfo: `(dev_args_ptr, dev_args_len), ret` of a kernel
    launched with aclrtLaunchKernel (arguments in device memory). -1 (0xFFFFFFFF as an
    aclError) for a null or unknown info or a task that is no launch; 207000 for a launch
    whose arguments were passed in host memory (simnpu keeps no device copy of them)."""
    found = _info(info)
    if found is None or not found.function:
        raise _NpuError(_INVALID_INFO, _NO_LAUNCH)
    if found.args is None:
        raise _NotSupportedError(
            "device arguments of a launch made with host arguments (aclrtGetArgsFromExceptionInfo)"
        )
    return found.args


@api("O", (0,), needs_session=False)
def get_func_handle_from_exception_info(rt, info):
    """aclrtGetFuncHandleFromExceptionInfo: `function, ret`, the launched kernel's handle;
    -1 (0xFFFFFFFF as an aclError) for a null or unknown info or a task that is no launch."""
    found = _info(info)
    if found is None or not found.function:
        raise _NpuError(_INVALID_INFO, _NO_LAUNCH)
    return found.function


# ---- tasks and device errors -----------------------------------------------------------------
@api("", (0,))
def get_thread_last_task_id(rt):
    """aclrtGetThreadLastTaskId: `task_id, ret`, the number of this thread's last
    asynchronous call (0 before the first)."""
    return rt.streams.get_thread_last_task_id()


@api("i", ({},))
def get_error_verbose(rt, device_id):
    """aclrtGetErrorVerbose: `error_info, ret`, aclrtErrorInfo as a dict (try_repair,
    has_detail, reserved, error_type, detail: {uce_info, aicore_err_type}). 107001 for a
    device that does not exist."""
    return rt.devices.get_error_verbose(device_id)


__getattr__, __dir__ = _on_demand(globals())
