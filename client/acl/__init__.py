"""pyACL-compatible `acl` for the simulated NPU: pyACL programs run unchanged.

    import acl
    ret = acl.init()
    ret = acl.rt.set_device(0)
    stream, ret = acl.rt.create_stream()
    dev, ret = acl.rt.malloc(1024, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    ...
    ret = acl.finalize()

The conventions are pyACL's: handles and pointers are ints; every acl.rt / acl.media call
returns the ACL return code last (`ret`, `(value, ret)`, ...), with the real numbers, and
never raises for an ACL-level error (acl.get_recent_err_msg() says what went wrong);
wrong Python argument types raise TypeError. acl.util returns what pyACL's does.

acl.init() connects to the daemon at SIMNPU_ADDRESS (or the per-user socket, starting one
there if none runs; at a named address only with SIMNPU_AUTOSTART=1). A call made before
acl.init() connects the same way; after acl.finalize()
calls return ACL_ERROR_UNINITIALIZE until acl.init() is called again.

Every ACL enum and return code is an attribute here under its full name
(acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_ERROR_RT_PARAM_INVALID, ...), and
acl.SIMNPU_BUILTIN_BINARY is the binary handle of simnpu's built-in kernel library:
    func, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
See docs/acl.md for every call and what simnpu does with it.
"""

from __future__ import annotations

import importlib as _importlib
import json as _json
import struct as _struct

from simnpu.client import facade as _api
from simnpu.client import last_error as _last_error
from simnpu.proto import codes as _codes
from simnpu.proto import commands as _commands
from simnpu.proto.errors import NpuError as _NpuError

from . import identity as _identity
from . import rt  # noqa: F401 - the pyACL submodules; acl.mdl, acl.media, acl.sys, acl.util on first use
from .data_buffer import (  # noqa: F401 - acl's own calls
    create_data_buffer,
    destroy_data_buffer,
    get_data_buffer_addr,
    get_data_buffer_size,
    get_data_buffer_size_v2,
    update_data_buffer,
)

_ON_FIRST_USE = ("mdl", "media", "sys", "util")

for _name in dir(_codes):
    if _name.startswith("ACL_"):
        globals()[_name] = getattr(_codes, _name)
del _name

SIMNPU_BUILTIN_BINARY = _commands.BUILTIN_BINARY
"""simnpu-specific: the binary handle of the built-in kernel library, present in every session."""


def init(config_path=None):
    """aclInit: start this process's session. `config_path` (a JSON file, as acl.json) is
    checked to exist and parse; its dump and profiling settings are not simulated.
    Returns ACL_ERROR_REPEAT_INITIALIZE (100002) when already initialized. Blocks."""
    if config_path is not None and not isinstance(config_path, str):
        raise TypeError(
            f"acl.init args parse failed: argument 1 must be str, not {type(config_path).__name__}"
        )
    with _api._lock:
        if _api.state.initialized:
            return _api.failed(
                _NpuError(
                    _codes.ACL_ERROR_REPEAT_INITIALIZE,
                    "acl.init was already called (acl.finalize ends the session)",
                ),
                "acl.init",
            )
        try:
            if config_path:
                _check_config(config_path)
            _api.state.finalized = False
            _api.session()
        except _NpuError as error:
            return _api.failed(error, "acl.init")
        _api.state.initialized = True
    return _codes.ACL_SUCCESS


def _check_config(path: str) -> None:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise _NpuError(
            _codes.ACL_ERROR_INVALID_FILE, f"cannot read config file {path}: {error}"
        ) from None
    if text.strip():
        try:
            _json.loads(text)
        except ValueError as error:
            raise _NpuError(
                _codes.ACL_ERROR_PARSE_FILE, f"config file {path} is not JSON: {error}"
            ) from None


def finalize():
    """aclFinalize: end the session; the daemon frees everything it still held (memory,
    streams, events). Returns ACL_ERROR_REPEAT_FINALIZE (100037) the second time. Blocks."""
    with _api._lock:
        if _api.state.finalized:
            return _api.failed(
                _NpuError(_codes.ACL_ERROR_REPEAT_FINALIZE, "acl.finalize was already called"),
                "acl.finalize",
            )
        _api.end_session()
        _api.state.initialized = False
        _api.state.finalized = True
    return _codes.ACL_SUCCESS


def get_recent_err_msg():
    """aclGetRecentErrMsg: the message of this thread's latest failed acl call, then cleared
    (None when there is none)."""
    return _last_error.message()


def float_to_float16(value):
    """aclFloatToFloat16: the IEEE half-precision bits (an int) of `value`."""
    if not isinstance(value, (int, float)):
        raise TypeError(
            f"acl.float_to_float16 args parse failed: must be float, not {type(value).__name__}"
        )
    try:
        return _struct.unpack("<H", _struct.pack("<e", value))[0]
    except OverflowError:
        return 0x7C00 if value > 0 else 0xFC00  # +-inf, as the C conversion saturates


def float16_to_float(value):
    """aclFloat16ToFloat: the float whose IEEE half-precision bits are `value`."""
    if not isinstance(value, int):
        raise TypeError(
            f"acl.float16_to_float args parse failed: must be int, not {type(value).__name__}"
        )
    return _struct.unpack("<e", _struct.pack("<H", value & 0xFFFF))[0]


_TYPE_SIZES = {
    _codes.ACL_FLOAT: 4,
    _codes.ACL_FLOAT16: 2,
    _codes.ACL_INT8: 1,
    _codes.ACL_INT32: 4,
    _codes.ACL_UINT8: 1,
    _codes.ACL_INT16: 2,
    _codes.ACL_UINT16: 2,
    _codes.ACL_UINT32: 4,
    _codes.ACL_INT64: 8,
    _codes.ACL_UINT64: 8,
    _codes.ACL_DOUBLE: 8,
    _codes.ACL_BOOL: 1,
    _codes.ACL_COMPLEX64: 8,
    _codes.ACL_COMPLEX128: 16,
    _codes.ACL_BF16: 2,
}


def data_type_size(data_type):
    """aclDataTypeSize: bytes per element of an aclDataType (0 for ACL_STRING and unknown types)."""
    if not isinstance(data_type, int):
        raise TypeError(
            f"acl.data_type_size args parse failed: must be int, not {type(data_type).__name__}"
        )
    return _TYPE_SIZES.get(data_type, 0)


def get_soc_name():
    """aclrtGetSocName: simnpu's own SoC name, "simnpu-simulated-npu" (no Ascend chip)."""
    return _identity.SOC_NAME


def get_version():
    """aclrtGetVersion (deprecated: use acl.sys.get_version_num): `major, minor, patch, ret`
    of simnpu's own version (not a CANN release's)."""
    return (*_identity.version_parts(), _codes.ACL_SUCCESS)


def get_cann_attribute(cann_attr):
    """aclGetCannAttribute: `value, ret` -- 1 if the simulated NPU has the aclCannAttr."""
    if not isinstance(cann_attr, int):
        raise TypeError(
            f"acl.get_cann_attribute args parse failed: must be int, not {type(cann_attr).__name__}"
        )
    value = _identity.CANN_ATTRIBUTES.get(cann_attr)
    if value is None:
        return 0, _api.failed(
            _NpuError(_codes.ACL_ERROR_INVALID_PARAM, f"unknown aclCannAttr {cann_attr}"),
            "acl.get_cann_attribute",
        )
    return value, _codes.ACL_SUCCESS


def get_cann_attribute_list():
    """aclGetCannAttributeList: `[aclCannAttr, ...], ret`, the attributes the simulated NPU
    supports (value 1), in enum order; as in the runtime, unsupported ones are not listed."""
    supported = [attr for attr, value in _identity.CANN_ATTRIBUTES.items() if value]
    return sorted(supported), _codes.ACL_SUCCESS


# name: (C call, values returned before ret (None: ret only), why)
_UNSUPPORTED = {
    "finalize_reference": (
        "aclFinalizeReference",
        (0,),
        "reference-counted finalization is not simulated (acl.finalize ends the session)",
    ),
    "init_callback_register": (
        "aclInitCallbackRegister",
        None,
        "init and finalize callbacks are not simulated",
    ),
    "init_callback_unregister": (
        "aclInitCallbackUnRegister",
        None,
        "init and finalize callbacks are not simulated",
    ),
    "finalize_callback_register": (
        "aclFinalizeCallbackRegister",
        None,
        "init and finalize callbacks are not simulated",
    ),
    "finalize_callback_unregister": (
        "aclFinalizeCallbackUnRegister",
        None,
        "init and finalize callbacks are not simulated",
    ),
    "get_device_capability": (
        "aclGetDeviceCapability",
        (0,),
        "aclDeviceInfo is not simulated (acl.rt.get_device_info reports the AI cores)",
    ),
}
UNSUPPORTED = sorted([*_UNSUPPORTED, "app_log"])
for _name, (_call, _outputs, _why) in _UNSUPPORTED.items():
    globals()[_name] = _api.not_supported(f"acl.{_name}", _call, _why, _outputs)
app_log = _api.not_supported(
    "acl.app_log",
    "aclAppLog",
    "the CANN application log is not simulated",
    (None,),
    returns_code=False,
)
del _name, _call, _outputs, _why

_NOT_PROVIDED = {
    "op": "single-operator execution (acl.op) is not simulated: launch kernels with acl.rt",
    "blas": (
        "acl.blas is not simulated: launch kernels with acl.rt "
        "(the built-in library has matmul_f32)"
    ),
    "prof": "profiling is not simulated",
    "himpi": "HiMPI media processing is not simulated",
    "fv": "feature-vector retrieval is not simulated",
}


def __getattr__(name: str):
    if name in _ON_FIRST_USE:
        return _importlib.import_module(f"acl.{name}")  # also binds acl.<name>
    if name in _NOT_PROVIDED:
        raise AttributeError(f"acl.{name} is not provided by simnpu: {_NOT_PROVIDED[name]}")
    raise AttributeError(f"module 'acl' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_ON_FIRST_USE})
