"""The kernel ABI: how a kernel is declared, and how its arguments travel.

A kernel module is plain Python that the daemon loads into its AI-core workers::

    from simnpu import kernel

    @kernel("ptr", "ptr", "ptr", "u32")
    def vadd(ctx, x, y, z, n):
        a = ctx.gm(x, "float32", n, access="r")
        ...

`@kernel(*types)` names the C type of every parameter after `ctx`: ``ptr`` (a device
address), ``i8``..``i64``, ``u8``..``u64``, ``f16``, ``f32``, ``f64``; numpy names
(``"int32"``, ``"float16"``, ...) and ``"half"``, ``"float"``, ``"double"`` are accepted
too. The arguments of a launch travel as one C struct of those types (`KernelSignature`):
little-endian, each field aligned to its own size, ``ptr`` 8 bytes, ``f16`` IEEE half,
padded at the end to the largest alignment -- what aclrtLaunchKernel's `args` buffer holds.
The daemon finds the kernels of a module with `discover_kernels`, from the source alone,
before any of it runs.

The `ctx` a kernel receives first (built by the daemon's worker; see `KernelContext`):

- ``ctx.block_idx``: this block's index, ``0 <= block_idx < block_num``.
- ``ctx.block_num``: the number of blocks of the launch (its blockDim).
- ``ctx.core_id``: the AI core running this block.
- ``ctx.gm(ptr, dtype, count, access="rw")``: a 1-D numpy view of `count` elements of
  `dtype` of device (global) memory starting at address `ptr`. The view must lie inside
  the allocation that holds `ptr`; otherwise the call raises. ``access="r"`` gives a
  read-only view, ``"rw"`` a writable one.
- ``ctx.saturation``: True when the launch's stream computes in the saturation mode
  (aclrtSetDeviceSatMode); ``ctx.saturate(view)`` applies that mode to float results.

Nothing here imports grpc or numpy.
"""

from __future__ import annotations

import ast
import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

if TYPE_CHECKING:
    import numpy

__all__ = [
    "TYPES",
    "KernelContext",
    "KernelSignature",
    "canonical_type",
    "discover_kernels",
    "is_kernel",
    "kernel",
    "signature_of",
]

# canonical name -> struct code; the size of each is also its alignment.
_CODES = {
    "ptr": "Q",
    "i8": "b",
    "i16": "h",
    "i32": "i",
    "i64": "q",
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "Q",
    "f16": "e",
    "f32": "f",
    "f64": "d",
}
TYPES = tuple(_CODES)
"""The canonical parameter type names."""

_ALIASES = {
    **{name: name for name in _CODES},
    **{f"int{bits}": f"i{bits}" for bits in (8, 16, 32, 64)},
    **{f"uint{bits}": f"u{bits}" for bits in (8, 16, 32, 64)},
    **{f"float{bits}": f"f{bits}" for bits in (16, 32, 64)},
    "half": "f16",
    "float": "f32",
    "double": "f64",
}


class KernelContext(Protocol):
    """What a kernel's `ctx` offers (the worker builds it; this only states the contract)."""

    block_idx: int
    block_num: int
    core_id: int
    saturation: bool  # the launch's stream computes in ACL_RT_OVERFLOW_MODE_SATURATION

    def gm(self, ptr: int, dtype: Any, count: int, access: str = "rw") -> numpy.ndarray:
        """A 1-D view of `count` `dtype` elements at device address `ptr`; "r": read-only."""
        ...

    def printf(self, fmt: str, *args: Any) -> None:
        """AscendC::printf (a C format): printed by the launching client when it synchronizes."""
        ...

    def raise_overflow(self) -> None:
        """Raise the float overflow flag (aclrtGetOverflowStatus reports it)."""
        ...

    def saturate(self, values: numpy.ndarray) -> None:
        """In the saturation mode, +-inf in `values` become the largest finite value of that
        sign and NaN 0, in place; in the Inf/NaN mode nothing changes."""
        ...


def canonical_type(name: str) -> str:
    """The canonical name ("u32") of a parameter type name ("u32", "uint32"); else ValueError."""
    canonical = _ALIASES.get(name) if isinstance(name, str) else None
    if canonical is None:
        raise ValueError(f"unknown kernel parameter type {name!r}; accepted: {', '.join(_ALIASES)}")
    return canonical


class KernelSignature:
    """The parameter types of a kernel and the C struct layout of its arguments.

    `types` are canonical names, `offsets` the byte offset of each field, `size` the struct
    size with its trailing padding, `end` the end of the last field (the shortest argument
    buffer `unpack` accepts).
    """

    __slots__ = ("_packer", "_unpacker", "end", "offsets", "size", "types")

    def __init__(self, types: Iterable[str]):
        if isinstance(types, str):
            raise TypeError(
                f"KernelSignature takes a sequence of type names, not the string {types!r}; "
                "use KernelSignature.from_wire for 'ptr,u32' text"
            )
        self.types = tuple(canonical_type(name) for name in types)
        fmt = "<"
        offsets = []
        offset = 0
        max_align = 1
        for name in self.types:
            code = _CODES[name]
            align = struct.calcsize("<" + code)
            pad = -offset % align
            if pad:
                fmt += f"{pad}x"
            offset += pad
            offsets.append(offset)
            fmt += code
            offset += align
            max_align = max(max_align, align)
        self.offsets = tuple(offsets)
        self.end = offset
        tail = -offset % max_align
        self.size = offset + tail
        self._unpacker = struct.Struct(fmt)
        self._packer = struct.Struct(fmt + (f"{tail}x" if tail else ""))

    def pack(self, *values: Any) -> bytes:
        """The argument struct of `values` (`size` bytes); ValueError if they do not fit."""
        if len(values) != len(self.types):
            raise ValueError(
                f"kernel takes {len(self.types)} argument(s) ({self.to_wire() or 'none'}), "
                f"got {len(values)}"
            )
        try:
            return self._packer.pack(*values)
        except (struct.error, OverflowError):
            raise ValueError(self._first_bad_value(values)) from None

    def unpack(self, buf: Any) -> tuple:
        """The argument values in `buf` (bytes-like); bytes past `end` are ignored.

        Raises NpuError(ACL_ERROR_RT_PARAM_INVALID) when `buf` is shorter than `end`.
        """
        try:
            return self._unpacker.unpack_from(buf)
        except struct.error:
            nbytes = memoryview(buf).nbytes
            if nbytes >= self.end:
                raise
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"kernel arguments ({self.to_wire() or 'none'}) need {self.end} bytes, "
                f"got {nbytes}",
            ) from None

    def to_wire(self) -> str:
        """The types as one string, "ptr,ptr,u32" ("" for no parameters)."""
        return ",".join(self.types)

    @classmethod
    def from_wire(cls, text: str) -> KernelSignature:
        """The signature `to_wire` wrote; ValueError on an unknown type name."""
        return cls(name.strip() for name in text.split(",")) if text.strip() else cls(())

    def _first_bad_value(self, values: tuple) -> str:
        for index, (name, value) in enumerate(zip(self.types, values)):
            try:
                struct.pack("<" + _CODES[name], value)
            except (struct.error, OverflowError) as exc:
                return f"kernel argument {index} ({name}) cannot be {value!r}: {exc}"
        return f"kernel arguments {values!r} do not fit {self.to_wire()}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelSignature) and self.types == other.types

    def __hash__(self) -> int:
        return hash(self.types)

    def __repr__(self) -> str:
        return f"KernelSignature({self.to_wire()!r})"

    def __reduce__(self):
        return (type(self), (self.types,))


_F = TypeVar("_F", bound=Callable[..., Any])

_CO_VARARGS = 0x04  # inspect.CO_VARARGS, without importing inspect


def kernel(*param_types: str) -> Callable[[_F], _F]:
    """Declare a kernel: `@kernel("ptr", "u32")` above `def name(ctx, x, n)`.

    Validates the types at once (ValueError) and returns the function itself, marked with
    its `KernelSignature` in `__simnpu_kernel__`, so it stays directly callable.
    """
    if len(param_types) == 1 and callable(param_types[0]):
        raise ValueError(
            'use @kernel(...) with the parameter types, e.g. @kernel("ptr", "u32"); '
            "@kernel() for a kernel without parameters"
        )
    signature = KernelSignature(param_types)

    def mark(fn: _F) -> _F:
        if not callable(fn):
            raise TypeError(f"@kernel decorates a function, not {fn!r}")
        code = getattr(fn, "__code__", None)
        if code is not None:
            kwdefaults = getattr(fn, "__kwdefaults__", None) or {}
            required_kwonly = code.co_kwonlyargcount - len(kwdefaults)
            _check_arity(
                fn.__name__,
                len(signature.types),
                code.co_argcount,
                bool(code.co_flags & _CO_VARARGS),
                required_kwonly,
                f"{code.co_filename}:{code.co_firstlineno}",
            )
        fn.__simnpu_kernel__ = signature  # type: ignore[attr-defined]
        return fn

    return mark


def is_kernel(obj: object) -> bool:
    """Whether `obj` was declared with @kernel(...)."""
    return isinstance(getattr(obj, "__simnpu_kernel__", None), KernelSignature)


def signature_of(fn: object) -> KernelSignature:
    """The KernelSignature of a @kernel function; TypeError for anything else."""
    signature = getattr(fn, "__simnpu_kernel__", None)
    if not isinstance(signature, KernelSignature):
        raise TypeError(f"{fn!r} is not a simnpu kernel (declare it with @kernel(...))")
    return signature


def _check_arity(
    name: str, n_types: int, n_positional: int, varargs: bool, required_kwonly: int, where: str
) -> None:
    if n_positional != n_types + 1 or varargs or required_kwonly:
        raise ValueError(
            f"kernel {name} declares {n_types} parameter type(s), so it must take exactly "
            f"{n_types + 1} positional parameters (ctx first): {name} at {where}"
        )


# --- discovery from source -------------------------------------------------------------------

_KERNEL_MODULES = ("simnpu", "simnpu.proto.kernel_abi")


def discover_kernels(source: str, filename: str = "<kernel module>") -> dict[str, KernelSignature]:
    """The kernels of a kernel module, found in its source without running it.

    Lists every top-level `def` decorated with `@kernel(...)`, `@simnpu.kernel(...)` or an
    imported alias of `kernel`, in source order. Raises ValueError for a kernel whose types
    are not string literals or unknown, or whose parameters do not match them; a
    SyntaxError propagates.
    """
    tree = ast.parse(source, filename)
    names, modules = _kernel_bindings(tree)
    kernels: dict[str, KernelSignature] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        kernels.pop(node.name, None)  # a later def rebinds the name, as it would at run time
        calls = [d for d in node.decorator_list if _is_kernel_ref(_callee(d), names, modules)]
        if not calls:
            continue
        where = f"{node.name} at {filename}:{calls[0].lineno}"
        if len(calls) > 1:
            raise ValueError(f"kernel declared more than once: {where}")
        call = calls[0]
        if not isinstance(call, ast.Call):
            raise ValueError(f"use @kernel(...) with the parameter types: {where}")  # noqa: TRY004
        if isinstance(node, ast.AsyncFunctionDef):
            raise ValueError(f"a kernel cannot be async: {where}")  # noqa: TRY004
        types = [
            arg.value
            for arg in call.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        ]
        if len(types) != len(call.args) or call.keywords:
            raise ValueError(f"kernel parameter types must be string literals: {where}")
        try:
            signature = KernelSignature(types)
        except ValueError as exc:
            raise ValueError(f"{exc}: {where}") from None
        args = node.args
        _check_arity(
            node.name,
            len(signature.types),
            len(args.posonlyargs) + len(args.args),
            args.vararg is not None,
            sum(default is None for default in args.kw_defaults),
            f"{filename}:{node.lineno}",
        )
        kernels[node.name] = signature
    return kernels


def _kernel_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names bound to `kernel` and to modules that export it, by the module's imports."""
    names = {"kernel"}
    modules = {"simnpu"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in _KERNEL_MODULES:
            names.update(a.asname or a.name for a in node.names if a.name == "kernel")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _KERNEL_MODULES and alias.asname:
                    modules.add(alias.asname)
    return names, modules


def _callee(decorator: ast.expr) -> ast.expr:
    return decorator.func if isinstance(decorator, ast.Call) else decorator


def _is_kernel_ref(expr: ast.expr, names: set[str], modules: set[str]) -> bool:
    """Whether `expr` is `kernel`, an alias of it, or `<module exporting kernel>.kernel`."""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.Attribute) and expr.attr == "kernel":
        return _dotted(expr.value) in modules | set(_KERNEL_MODULES)
    return False


def _dotted(expr: ast.expr) -> str | None:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))
