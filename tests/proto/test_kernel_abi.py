"""The kernel ABI: type names, argument struct layout and packing, @kernel, discovery."""

import ctypes
import math
import pickle
import textwrap

import numpy as np
import pytest

import simnpu
from simnpu.proto import codes, kernel_abi
from simnpu.proto.errors import NpuError
from simnpu.proto.kernel_abi import (
    TYPES,
    KernelSignature,
    canonical_type,
    discover_kernels,
    is_kernel,
    kernel,
    signature_of,
)

# --- type names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TYPES)
def test_canonical_names_are_their_own_canonical_form(name):
    assert canonical_type(name) == name


NUMPY_NAMES = {
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "f16",
    "float32": "f32",
    "float64": "f64",
}


@pytest.mark.parametrize(("name", "canonical"), NUMPY_NAMES.items())
def test_numpy_names_map_to_the_type_of_the_same_size(name, canonical):
    assert canonical_type(name) == canonical
    assert KernelSignature([name]).end == np.dtype(name).itemsize


@pytest.mark.parametrize(
    ("name", "canonical"), [("half", "f16"), ("float", "f32"), ("double", "f64")]
)
def test_short_forms(name, canonical):
    assert canonical_type(name) == canonical


@pytest.mark.parametrize(
    "name", ["float128", "int", "pointer", "void*", "F32", " u32", "", "bool", None, 4]
)
def test_unknown_type_names_are_rejected_with_the_accepted_ones(name):
    with pytest.raises(ValueError, match="unknown kernel parameter type") as info:
        canonical_type(name)
    assert repr(name) in str(info.value)
    assert "ptr" in str(info.value)
    assert "float32" in str(info.value)


# --- layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "offsets", "end", "size"),
    [
        (("u8", "ptr", "u16", "f64"), (0, 8, 16, 24), 32, 32),
        (("u32",), (0,), 4, 4),
        (("f16", "f16", "u32"), (0, 2, 4), 8, 8),
        (("ptr", "u8"), (0, 8), 9, 16),
        (("u8", "u16", "u8"), (0, 2, 4), 5, 6),
        (("i8", "f32", "i16"), (0, 4, 8), 10, 12),
        (("ptr", "ptr", "ptr", "u32"), (0, 8, 16, 24), 28, 32),
        ((), (), 0, 0),
    ],
)
def test_layout_is_the_c_struct_with_natural_alignment(types, offsets, end, size):
    signature = KernelSignature(types)
    assert signature.types == types
    assert signature.offsets == offsets
    assert signature.end == end
    assert signature.size == size
    assert len(signature.pack(*[0] * len(types))) == size


_CTYPES = {
    "ptr": ctypes.c_uint64,
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u8": ctypes.c_uint8,
    "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
    "f16": ctypes.c_uint16,  # ctypes has no half; same size and alignment
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}


@pytest.mark.skipif(ctypes.alignment(ctypes.c_double) != 8, reason="needs an LP64 ABI")
@pytest.mark.parametrize(
    "types",
    [
        ("u8", "f64", "u16"),
        ("f16", "ptr", "i8", "i32", "u8"),
        ("i16", "i8", "u64", "f32", "f16", "u8"),
        TYPES,
        tuple(reversed(TYPES)),
    ],
)
def test_layout_matches_ctypes(types):
    fields = [(f"f{i}", _CTYPES[name]) for i, name in enumerate(types)]
    struct_type = type("Args", (ctypes.Structure,), {"_fields_": fields})
    signature = KernelSignature(types)
    assert signature.offsets == tuple(getattr(struct_type, name).offset for name, _ in fields)
    assert signature.size == ctypes.sizeof(struct_type)


def test_pack_is_little_endian_with_zero_padding():
    signature = KernelSignature(["u8", "ptr", "u16"])
    data = signature.pack(0xAB, 0x0102030405060708, 0xBEEF)
    assert data == (b"\xab" + b"\0" * 7 + bytes([8, 7, 6, 5, 4, 3, 2, 1]) + b"\xef\xbe" + b"\0" * 6)


# --- pack / unpack ------------------------------------------------------------------------------

EXTREMES = {
    "ptr": [0, 1 << 47, 2**64 - 1],
    "i8": [-128, 0, 127],
    "i16": [-(2**15), 2**15 - 1],
    "i32": [-(2**31), 2**31 - 1],
    "i64": [-(2**63), 2**63 - 1],
    "u8": [0, 255],
    "u16": [0, 2**16 - 1],
    "u32": [0, 2**32 - 1],
    "u64": [0, 2**64 - 1],
    "f16": [65504.0, -65504.0, 2.0**-24, 2.0**-14, -0.0, math.inf, -math.inf],
    "f32": [float(np.finfo(np.float32).max), 2.0**-149, -1.5, math.inf],
    "f64": [1.7976931348623157e308, 5e-324, -math.inf, math.pi],
}


@pytest.mark.parametrize("name", TYPES)
def test_round_trip_of_extreme_values(name):
    signature = KernelSignature([name])
    for value in EXTREMES[name]:
        (back,) = signature.unpack(signature.pack(value))
        assert back == value
        assert type(back) is type(value)
        assert math.copysign(1, back) == math.copysign(1, value)


@pytest.mark.parametrize("name", ["f16", "f32", "f64"])
def test_nan_round_trips(name):
    signature = KernelSignature([name])
    (back,) = signature.unpack(signature.pack(math.nan))
    assert math.isnan(back)


def test_round_trip_of_every_type_in_one_struct():
    signature = KernelSignature(TYPES)
    for pick in (0, -1):
        values = [EXTREMES[name][pick] for name in TYPES]
        assert signature.unpack(signature.pack(*values)) == tuple(values)


def test_pack_rounds_floats_to_their_width():
    signature = KernelSignature(["f16", "f32", "f64"])
    assert signature.unpack(signature.pack(0.1, 0.1, 0.1)) == (
        float(np.float16(0.1)),
        float(np.float32(0.1)),
        0.1,
    )


def test_pack_accepts_numpy_scalars_and_bools():
    signature = KernelSignature(["u32", "f16", "i8"])
    packed = signature.pack(np.uint32(7), np.float16(1.5), True)
    assert signature.unpack(packed) == (7, 1.5, 1)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("i8", 128),
        ("i8", -129),
        ("u8", -1),
        ("u8", 256),
        ("u16", 2**16),
        ("i32", 2**31),
        ("u32", -1),
        ("u32", 2**32),
        ("i64", 2**63),
        ("u64", 2**64),
        ("ptr", -1),
        ("ptr", 2**64),
        ("f16", 65520.0),
        ("f32", 1e39),
        ("u32", 1.5),
        ("u32", "7"),
        ("f32", "x"),
        ("ptr", None),
    ],
)
def test_pack_rejects_values_that_do_not_fit(name, value):
    signature = KernelSignature(["u8", name])
    with pytest.raises(ValueError, match=rf"kernel argument 1 \({name}\) cannot be"):
        signature.pack(0, value)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_pack_rejects_a_wrong_number_of_values(count):
    signature = KernelSignature(["ptr", "u32"])
    with pytest.raises(ValueError, match=rf"takes 2 argument\(s\) \(ptr,u32\), got {count}"):
        signature.pack(*range(count))


def test_unpack_needs_end_bytes_not_the_trailing_padding():
    signature = KernelSignature(["ptr", "u8"])
    data = signature.pack(1 << 47, 9)
    assert signature.unpack(data[: signature.end]) == (1 << 47, 9)
    assert signature.unpack(data + b"extra bytes") == (1 << 47, 9)
    assert signature.unpack(bytearray(data)) == (1 << 47, 9)
    assert signature.unpack(memoryview(data)) == (1 << 47, 9)


@pytest.mark.parametrize("length", [0, 1, 8])
def test_unpack_of_a_short_buffer_is_param_invalid(length):
    signature = KernelSignature(["ptr", "u8"])
    with pytest.raises(NpuError) as info:
        signature.unpack(bytes(length))
    assert info.value.code == codes.ACL_ERROR_RT_PARAM_INVALID == 107000
    assert f"need 9 bytes, got {length}" in info.value.message


def test_a_signature_without_parameters():
    signature = KernelSignature([])
    assert signature.pack() == b""
    assert signature.unpack(b"") == ()
    assert signature.unpack(b"ignored") == ()


# --- the signature as a value -------------------------------------------------------------------


def test_wire_form_round_trips():
    signature = KernelSignature(["ptr", "uint32", "half"])
    assert signature.to_wire() == "ptr,u32,f16"
    assert KernelSignature.from_wire("ptr,u32,f16") == signature
    assert KernelSignature.from_wire(" ptr , u32,f16 ") == signature
    assert KernelSignature.from_wire("") == KernelSignature(())
    assert KernelSignature(()).to_wire() == ""


def test_from_wire_rejects_unknown_types():
    with pytest.raises(ValueError, match="'q32'"):
        KernelSignature.from_wire("ptr,q32")
    with pytest.raises(ValueError, match="''"):
        KernelSignature.from_wire("ptr,,u32")


def test_a_bare_string_is_not_a_sequence_of_types():
    with pytest.raises(TypeError, match="from_wire"):
        KernelSignature("ptr")


def test_signatures_compare_hash_and_pickle_by_their_types():
    signature = KernelSignature(["float32", "ptr"])
    assert signature == KernelSignature(["f32", "ptr"])
    assert signature != KernelSignature(["ptr", "f32"])
    assert hash(signature) == hash(KernelSignature(["f32", "ptr"]))
    copy = pickle.loads(pickle.dumps(signature))
    assert copy == signature
    assert copy.unpack(copy.pack(0.5, 3)) == (0.5, 3)
    assert repr(signature) == "KernelSignature('f32,ptr')"


# --- @kernel ------------------------------------------------------------------------------------


def test_kernel_marks_and_returns_the_function_itself():
    def vadd(ctx, x, y, z, n):
        return ctx, x + y + z + n

    marked = kernel("ptr", "ptr", "ptr", "uint32")(vadd)
    assert marked is vadd
    assert is_kernel(vadd)
    assert signature_of(vadd) == KernelSignature(["ptr", "ptr", "ptr", "u32"])
    assert vadd.__simnpu_kernel__ is signature_of(vadd)
    assert vadd("ctx", 1, 2, 3, 4) == ("ctx", 10)


def test_the_package_exports_the_same_decorator():
    assert simnpu.kernel is kernel_abi.kernel


def test_a_kernel_without_parameters():
    @kernel()
    def nothing(ctx):
        pass

    assert signature_of(nothing).types == ()


def test_bad_types_fail_at_decoration():
    with pytest.raises(ValueError, match="'f8'"):
        kernel("ptr", "f8")


def test_kernel_without_parentheses_is_rejected():
    with pytest.raises(ValueError, match=r"use @kernel\(...\)"):

        @kernel
        def vadd(ctx, x):
            pass


@pytest.mark.parametrize(
    "source",
    [
        "def f(ctx, x): pass",
        "def f(ctx, x, n, extra): pass",
        "def f(ctx, x, *rest): pass",
        "def f(ctx, x, n, *, flag): pass",
    ],
)
def test_kernel_checks_the_parameter_count(source):
    namespace = {}
    exec(source, namespace)  # noqa: S102 -- the test's own source
    with pytest.raises(ValueError, match="must take exactly 3 positional parameters"):
        kernel("ptr", "u32")(namespace["f"])


def test_keyword_only_parameters_with_defaults_are_allowed():
    @kernel("ptr")
    def f(ctx, x, *, debug=False):
        pass

    assert is_kernel(f)


def test_plain_functions_are_not_kernels():
    def plain(ctx, x):
        pass

    assert not is_kernel(plain)
    assert not is_kernel(None)
    with pytest.raises(TypeError, match="not a simnpu kernel"):
        signature_of(plain)


# --- discovery ----------------------------------------------------------------------------------


def discover(source, filename="mod.py"):
    return discover_kernels(textwrap.dedent(source), filename)


def run_and_collect(source):
    """What the module defines when it runs: the same answer discovery must give."""
    namespace = {}
    exec(compile(textwrap.dedent(source), "mod.py", "exec"), namespace)  # noqa: S102
    return {name: signature_of(obj) for name, obj in namespace.items() if is_kernel(obj)}


def test_discovery_finds_decorated_functions_in_source_order():
    source = """
        import numpy as np
        from simnpu import kernel

        @kernel("ptr", "ptr", "u32")
        def scale(ctx, x, y, n):
            pass

        def helper(x):
            return x

        @kernel()
        def empty(ctx):
            pass

        @kernel("ptr", "float32", "u32")
        def fill(ctx, x, value, n):
            pass
    """
    found = discover(source)
    assert list(found) == ["scale", "empty", "fill"]
    assert found["fill"] == KernelSignature(["ptr", "f32", "u32"])
    assert found == run_and_collect(source)


def test_discovery_follows_an_aliased_import():
    source = """
        from simnpu import kernel as k

        @k("ptr", "u32")
        def a(ctx, x, n):
            pass
    """
    assert discover(source) == {"a": KernelSignature(["ptr", "u32"])} == run_and_collect(source)


@pytest.mark.parametrize(
    ("imports", "decorator"),
    [
        ("import simnpu", "simnpu.kernel"),
        ("import simnpu as sn", "sn.kernel"),
        ("import simnpu.proto.kernel_abi", "simnpu.proto.kernel_abi.kernel"),
        ("from simnpu.proto.kernel_abi import kernel as kk", "kk"),
    ],
)
def test_discovery_follows_module_imports(imports, decorator):
    source = f"""
{imports}

@{decorator}("f16", "i64")
def b(ctx, v, w):
    pass
"""
    assert discover(source) == {"b": KernelSignature(["f16", "i64"])} == run_and_collect(source)


def test_discovery_does_not_run_the_source():
    source = """
        raise RuntimeError("must not run")

        from simnpu import kernel

        @kernel("u8")
        def k(ctx, v):
            pass
    """
    assert discover(source) == {"k": KernelSignature(["u8"])}


def test_other_decorators_nested_functions_and_methods_are_not_kernels():
    source = """
        import functools
        from simnpu import kernel

        @functools.lru_cache()
        def cached(x):
            return x

        class Holder:
            @kernel("ptr")
            def method(ctx, x):
                pass

        def outer():
            @kernel("ptr")
            def inner(ctx, x):
                pass
            return inner
    """
    assert discover(source) == {}


def test_a_later_definition_replaces_an_earlier_one():
    source = """
        from simnpu import kernel

        @kernel("ptr")
        def twice(ctx, x):
            pass

        def twice(x):
            pass

        @kernel("u8")
        def again(ctx, x):
            pass

        @kernel("u16")
        def again(ctx, x):
            pass
    """
    assert discover(source) == {"again": KernelSignature(["u16"])} == run_and_collect(source)


@pytest.mark.parametrize(
    "decorator",
    [
        '@kernel("ptr", TYPE)',
        "@kernel(*TYPES)",
        '@kernel("ptr", type="u32")',
        '@kernel("ptr", f"u{32}")',
        '@kernel("ptr", 32)',
    ],
)
def test_non_literal_types_are_rejected_with_the_place(decorator):
    source = f"""from simnpu import kernel
TYPE = TYPES = "u32"
{decorator}
def f(ctx, x, n):
    pass
"""
    with pytest.raises(ValueError) as info:
        discover(source)
    assert str(info.value) == "kernel parameter types must be string literals: f at mod.py:3"


def test_unknown_literal_types_are_rejected_with_the_place():
    source = """
        from simnpu import kernel

        @kernel("ptr", "u31")
        def f(ctx, x, n):
            pass
    """
    with pytest.raises(ValueError, match=r"'u31'.*f at mod.py:4"):
        discover(source)


@pytest.mark.parametrize(
    "params", ["ctx, x", "ctx, x, n, extra", "ctx, x, *more", "ctx, x, n, *, flag", "ctx, /, x"]
)
def test_a_wrong_parameter_count_is_rejected(params):
    source = f"""from simnpu import kernel

@kernel("ptr", "u32")
def f({params}):
    pass
"""
    with pytest.raises(
        ValueError, match=r"exactly 3 positional parameters \(ctx first\).*mod.py:4"
    ):
        discover(source)


def test_positional_only_and_defaulted_keyword_only_parameters_count_like_at_run_time():
    source = """
        from simnpu import kernel

        @kernel("ptr", "u32")
        def f(ctx, x, /, n, *, debug=False):
            pass
    """
    assert discover(source) == {"f": KernelSignature(["ptr", "u32"])} == run_and_collect(source)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("from simnpu import kernel\n@kernel\ndef f(ctx): pass\n", r"use @kernel\(...\)"),
        (
            'from simnpu import kernel\n@kernel("u8")\nasync def f(ctx, x): pass\n',
            "cannot be async",
        ),
        (
            'from simnpu import kernel\n@kernel("u8")\n@kernel("u8")\ndef f(ctx, x): pass\n',
            "more than once",
        ),
    ],
)
def test_misused_decorators_are_rejected(source, message):
    with pytest.raises(ValueError, match=message):
        discover(source)


def test_syntax_errors_propagate():
    with pytest.raises(SyntaxError) as info:
        discover_kernels("from simnpu import kernel\n\ndef broken(:\n    pass\n", "bad.py")
    assert info.value.filename == "bad.py"
    assert info.value.lineno == 3
