"""The one facade helper behind every `acl` and `hccl` call, and the session they share.

A pyACL-style function is written as a body that takes the Runtime first and raises
NpuError, decorated with `@api(spec, outputs)`. A small function with the body's own
parameters is generated for it, once, the first time the call is looked up (`on_demand`);
it

- checks argument types as pyACL's PyArg_ParseTuple format does, raising TypeError,
- finds the session (connecting on first use when acl.init() was not called),
- takes the call site (transport.call_site: the caller's file:line) when the call sends
  anything, and passes it down (`site=`),
- calls the body, or the part's method it delegates to, and turns an NpuError into its
  return code, kept with its message as the thread's last error (client/last_error.py:
  acl.rt.get_last_error, acl.get_recent_err_msg, hccl.get_recent_err_msg),
- returns the C call's shape: `ret`, `(value, ret)` or `(v1, v2, ret)`.

Generating the function (as namedtuple and dataclasses do) keeps the hot paths -- launch,
memcpy_async, record_event -- at one extra Python call over the raw layer, with no *args
packing and no per-call introspection: a generic wrapper that checks a spec in a loop adds
about 1 µs per call where the generated function adds tens of nanoseconds (bench/run.py's
facade row, docs/decisions/generated-facade-functions.md). This is the only generated code
of the client.

Format letters (pyACL's): k/K an int (pointer, size, handle; no other type, as "k" does),
i/I an integer (anything with __index__, never a float), s a str, p a path (str or
os.PathLike), C a callable, O anything.
"""

from __future__ import annotations

import inspect
import operator
import os
import struct
import threading
from collections.abc import Callable

from simnpu.client import last_error
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

_lock = threading.RLock()


class _State:
    initialized = False  # acl.init() succeeded and acl.finalize() has not run since
    finalized = False  # acl.finalize() ran: no lazy reconnection until acl.init()


state = _State()

# Globals of the generated functions (this module's code); "_rt" is the session's Runtime (None
# before the first call), "_call_site" transport.call_site (set when the first is generated).
_NS: dict = {"__builtins__": __builtins__, "__name__": __name__, "_rt": None}


# ---- the session --------------------------------------------------------------------------------
def session():
    """The session's Runtime, connecting on first use (the daemon at SIMNPU_ADDRESS or the
    per-user socket, started if none runs). Raises NpuError."""
    runtime = _NS["_rt"]
    if runtime is not None:
        return runtime
    with _lock:
        if _NS["_rt"] is None:
            if state.finalized:
                raise NpuError(
                    codes.ACL_ERROR_UNINITIALIZE,
                    "acl.finalize() ended this process's session: call acl.init() first",
                )
            from simnpu.client import device

            _NS["_rt"] = device.connect()
        return _NS["_rt"]


def end_session() -> None:
    """Close the session (the daemon frees what it still owned)."""
    with _lock:
        if _NS["_rt"] is not None:
            from simnpu.client import device

            _NS["_rt"] = None
            device.shutdown()


# ---- failures ------------------------------------------------------------------------------------
def failed(error: NpuError, name: str) -> int:
    """An acl call failed: keep `error` as this thread's last error; its code."""
    return last_error.keep(error.code, f"{name}: {error}")


def _out_of_range(error: Exception, name: str) -> int:
    return failed(
        NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"argument out of range: {error}"), name
    )


def raw(delegate: str) -> Callable:
    """The raw layer's call `delegate` ("part.method") without its own error keeping (the
    facade keeps them): the part's method to call as `method(rt.part, ...)`, one call less
    on the hot paths."""
    from simnpu.client.runtime import PARTS

    part, _, name = delegate.partition(".")
    return last_error.unrecorded(getattr(PARTS[part], name))


def _site_argument(function: Callable, given: int) -> str | None:
    """How a generated call passes the call site to `function` (a part's method, `self`
    first) given `given` arguments: positionally when they fill every parameter before
    `site`, else by name; None when it takes no site (it sends nothing)."""
    names = list(inspect.signature(function).parameters)[1:]
    if "site" not in names:
        return None
    return "_call_site()" if names.index("site") == given else "site=_call_site()"


# ---- argument checks (the slow paths; the generated code tests `x.__class__ is int` first) ------
# `position` counts from 1, `param` is the parameter's name; a failure is a TypeError naming
# both, the type expected and the type given, as pyACL's argument parsing raises one.
def _kind(value) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _wrong(name: str, position: int, param: str, expected: str, value) -> TypeError:
    return TypeError(
        f"{name} args parse failed: argument {position} ({param}) must be {expected}, "
        f"not {_kind(value)}"
    )


def _k(value, position: int, name: str, param: str) -> int:
    if isinstance(value, int):
        return int(value)
    if not _is_pointer(param):
        raise _wrong(name, position, param, "int", value)
    error = _wrong(name, position, param, "a pointer (int)", value)
    if hasattr(value, "__array_interface__"):  # a numpy array: say where its address comes from
        hint = "acl.util.numpy_to_ptr(array) is the address of an array's host memory"
    elif isinstance(value, (bytes, bytearray)):
        hint = "acl.util.bytes_to_ptr(data) is the address of a bytes object's data"
    else:
        raise error
    raise TypeError(f"{error}: {hint}; device addresses are the ints acl.rt.malloc returns")


def _is_pointer(param: str) -> bool:
    """Whether a "k" parameter holds an address (pyACL's dst, src and *_ptr)."""
    return param in ("dst", "src") or param.endswith("ptr")


def _i(value, position: int, name: str, param: str) -> int:
    if not isinstance(value, float):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise _wrong(name, position, param, "int", value)


def _s(value, position: int, name: str, param: str) -> str:
    if isinstance(value, str):
        return str(value)
    raise _wrong(name, position, param, "str", value)


def _p(value, position: int, name: str, param: str):
    try:
        return os.fspath(value)
    except TypeError:
        raise _wrong(name, position, param, "a path (str)", value) from None


def _c(value, position: int, name: str, param: str):
    raise _wrong(name, position, param, "callable", value)


_CHECKS = {
    "k": "    if {p}.__class__ is not int: {p} = _k({p}, {n}, {name!r}, {p!r})\n",
    "K": "    if {p}.__class__ is not int: {p} = _k({p}, {n}, {name!r}, {p!r})\n",
    "i": "    if {p}.__class__ is not int: {p} = _i({p}, {n}, {name!r}, {p!r})\n",
    "I": "    if {p}.__class__ is not int: {p} = _i({p}, {n}, {name!r}, {p!r})\n",
    "s": "    if {p}.__class__ is not str: {p} = _s({p}, {n}, {name!r}, {p!r})\n",
    "p": "    if {p}.__class__ is not str: {p} = _p({p}, {n}, {name!r}, {p!r})\n",
    "C": "    if not callable({p}): _c({p}, {n}, {name!r}, {p!r})\n",
    "O": "",
}
_NS.update(
    _k=_k,
    _i=_i,
    _s=_s,
    _p=_p,
    _c=_c,
    _failed=failed,
    _out_of_range=_out_of_range,
    _session=session,
    _NpuError=NpuError,
    _RangeErrors=(OverflowError, struct.error),
    _INVALID_PARAM=codes.ACL_ERROR_INVALID_PARAM,
)


def api(
    spec: str = "",
    outputs: tuple | None = None,
    *,
    delegate: str | None = None,
    nonnull: tuple = (),
    needs_session: bool = True,
    failure: Callable[[NpuError, str], int] = failed,
    range_checked: bool = True,
):
    """Make `body(rt, *params)` a pyACL-style function (see the module docstring), generated
    the first time it is looked up: the module ends with `on_demand`.

    `spec` has one format letter per parameter after `rt`. `outputs` is None when the call
    returns only `ret`; else the values it returns on failure, one per output (the body
    returns the value, or a tuple of them when there are several). `delegate="part.name"`
    says the call is exactly the raw layer's `rt.part.name(*params)` (its other parameters
    keep their defaults; the body is then only its docstring): it is called inline, saving
    calls on the hot paths. A body that sends takes the call site as a keyword-only `site`
    parameter and passes it on; a delegate is given it when it has one. `nonnull` names
    pointer
    parameters that ACL's own layer rejects when null (ACL_ERROR_INVALID_PARAM, 100000)
    before the runtime sees them. `failure(error, name)` keeps a failure and returns the
    code the call returns (hccl's: an HcclResult); `range_checked`: an argument too big
    for its C type is 107000, as in acl (else OverflowError propagates).
    """

    def defer(body):
        code = body.__code__
        params = code.co_varnames[1 : code.co_argcount]
        if len(spec) != len(params):
            raise TypeError(
                f"{body.__name__}: spec {spec!r} does not match parameters {list(params)}"
            )
        return _Deferred(lambda: make(body, params))

    def make(body, params):
        if "_call_site" not in _NS:
            from simnpu.client.transport import call_site

            _NS["_call_site"] = call_site
        module = body.__module__
        name = f"{module}.{body.__name__}"
        target = f"_body_{module.replace('.', '_')}_{body.__name__}"
        _NS[target] = body
        report = f"_failure_{module.replace('.', '_')}_{body.__name__}"
        _NS[report] = failure
        arguments = ", ".join(params)
        lines = [f"def {body.__name__}({arguments}):\n"]
        for position, (letter, param) in enumerate(zip(spec, params), 1):
            lines.append(_CHECKS[letter].format(p=param, n=position, name=name))
        if delegate is not None:
            part = delegate.partition(".")[0]
            method = f"_raw_{delegate.replace('.', '_')}"
            function = _NS.setdefault(method, raw(delegate))
            passed = _site_argument(function, len(params))
            call = f"{method}({', '.join([f'rt.{part}', *params, *([passed] if passed else [])])})"
        else:
            code = body.__code__
            keywords = code.co_varnames[
                code.co_argcount : code.co_argcount + code.co_kwonlyargcount
            ]
            sited = ["site=_call_site()"] if "site" in keywords else []
            call = f"{target}({', '.join(['rt', *params, *sited])})"
        if outputs is None:
            result, failed_call, success = call, f"{report}(error, {name!r})", "0"
        else:
            defaults = "".join(f"{value!r}, " for value in outputs)
            result = f"_result = {call}"
            failed_call = f"({defaults}{report}(error, {name!r}))"
            success = "(_result, 0)" if len(outputs) == 1 else "(*_result, 0)"
        acquire = (
            "        rt = _rt\n        if rt is None:\n            rt = _session()\n"
            if needs_session
            else "        rt = None\n"
        )
        checks = "".join(
            f"        if not {param}:\n"
            f"            raise _NpuError(_INVALID_PARAM, '{param} is null')\n"
            for param in nonnull
        )
        lines.append("    try:\n" + checks + acquire + f"        {result}\n")
        lines.append(f"    except _NpuError as error:\n        return {failed_call}\n")
        if range_checked:
            lines.append(
                "    except _RangeErrors as error:\n"
                f"        return {failed_call.replace(report + '(', '_out_of_range(')}\n"
            )
        lines.append(f"    return {success}\n")
        made: dict = {}  # not _NS itself: threads may generate the same call at once
        exec("".join(lines), _NS, made)  # noqa: S102 - source built above from the body's own signature
        function = made[body.__name__]
        function.__defaults__ = body.__defaults__
        function.__doc__ = body.__doc__
        function.__module__ = module
        function.__qualname__ = body.__qualname__
        function.body = body
        return function

    return defer


class _Deferred:
    """An @api function not generated yet (what the decorator leaves until on_demand)."""

    __slots__ = ("generate",)

    def __init__(self, generate):
        self.generate = generate


def on_demand(namespace: dict, *extensions, missing=None):
    """The `__getattr__` and `__dir__` (PEP 562) of a module of @api functions: called at
    its end with `globals()`, it takes them out of the namespace; each is generated the
    first time it is looked up and then kept there like any function. Compiling all of
    them at import would cost every process several milliseconds before its first call.

    The names an `extensions` module lists in `__all__` are its own (acl.rt re-exports
    acl.rt_memory); `missing(name)` raises for other names (default: AttributeError).
    Star imports still see every call (`__all__`, unless the module has one).
    """
    deferred = {name: value for name, value in namespace.items() if value.__class__ is _Deferred}
    for name in deferred:
        del namespace[name]
    borrowed = {name: module for module in extensions for name in module.__all__}
    module_name = namespace["__name__"]
    if "__all__" not in namespace:
        namespace["__all__"] = sorted(
            name for name in {*namespace, *deferred, *borrowed} if name[0] != "_"
        )

    def __getattr__(name: str):
        if name in deferred:
            function = deferred[name].generate()
        elif name in borrowed:
            function = getattr(borrowed[name], name)
        elif missing is not None:
            return missing(name)
        else:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return namespace.setdefault(name, function)  # a racing thread's twin is dropped

    def __dir__():
        return sorted({*namespace, *deferred, *borrowed})

    return __getattr__, __dir__


def not_supported(
    name: str, call: str, why: str, outputs: tuple | None = None, *, returns_code: bool = True
):
    """A pyACL function simnpu does not simulate: it returns ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    (207000) in pyACL's shape and says why in acl.get_recent_err_msg(). A function whose C
    call returns a value and no aclError (`returns_code=False`) returns `outputs[0]`."""
    message = f"{call} is not supported by the simulated NPU: {why}"

    def unsupported(*args, **kwargs):
        code = failed(NpuError(codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, message), name)
        if outputs is None:
            return code
        return (*outputs, code) if returns_code else outputs[0]

    unsupported.__name__ = unsupported.__qualname__ = name.rpartition(".")[2]
    unsupported.__doc__ = (
        f"Not supported ({call}): {why}. Returns ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000)."
    )
    unsupported.not_supported = True  # type: ignore[attr-defined]
    unsupported.acl_call = call  # type: ignore[attr-defined]
    unsupported.why = why  # type: ignore[attr-defined]
    return unsupported
