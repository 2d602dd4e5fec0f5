"""Kernels through a real daemon: every built-in kernel against numpy, user kernel modules
(from a file and from source), what a kernel sees (block index, block count, core, the
argument struct, only the memory it was given) and how its failures are reported.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from conftest import GATE, start_client

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

BLOCKS = [1, 2, 5]
TAIL = 5  # elements after every output that no kernel may touch
SENTINEL = 12345.0
TOLERANCE = {np.float32: {"rtol": 1e-5, "atol": 1e-6}, np.float16: {"rtol": 2e-3, "atol": 2e-3}}


@pytest.fixture
def rt(npu):
    with npu.Device(0):
        yield npu.runtime()


class Buffers:
    """Device buffers for one test, with TAIL sentinel elements after each."""

    def __init__(self, npu):
        self.npu = npu
        self.made = []

    def put(self, array) -> object:
        array = np.ascontiguousarray(array)
        padded = np.concatenate([array.reshape(-1), np.full(TAIL, SENTINEL, array.dtype)])
        buffer = self.npu.DeviceBuffer.from_array(padded)
        self.made.append(buffer)
        return buffer

    def empty(self, dtype, count) -> object:
        return self.put(np.full(count, SENTINEL, dtype))

    def get(self, buffer, dtype, count) -> np.ndarray:
        data = buffer.to_numpy(dtype)
        assert (data[count : count + TAIL] == np.asarray(SENTINEL, dtype)).all(), (
            "a kernel wrote past the elements it was given"
        )
        return data[:count]

    def free(self) -> None:
        for buffer in self.made:
            buffer.free()


@pytest.fixture
def buffers(npu, rt):
    made = Buffers(npu)
    yield made
    made.free()


def close(actual, expected, dtype):
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), **TOLERANCE[dtype]
    )


# ---- built-in kernels ----------------------------------------------------------------------------

DTYPES = {"f32": np.float32, "f16": np.float16}
ELEMENTWISE = 1001  # not a multiple of any block count


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("suffix", ["f32", "f16"])
@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_elementwise(npu, buffers, op, suffix, blocks):
    dtype = DTYPES[suffix]
    rng = np.random.default_rng(blocks)
    a = rng.uniform(-3, 3, ELEMENTWISE).astype(dtype)
    b = rng.uniform(-3, 3, ELEMENTWISE).astype(dtype)
    x, y, z = buffers.put(a), buffers.put(b), buffers.empty(dtype, ELEMENTWISE)
    npu.builtin(f"{op}_{suffix}").launch(blocks, x, y, z, ELEMENTWISE)
    npu.current_stream().synchronize()
    expected = {"add": np.add, "mul": np.multiply}[op](a, b)
    np.testing.assert_array_equal(buffers.get(z, dtype, ELEMENTWISE), expected)
    np.testing.assert_array_equal(buffers.get(x, dtype, ELEMENTWISE), a)  # inputs untouched


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("suffix", ["f32", "f16"])
@pytest.mark.parametrize("op", ["relu", "exp"])
def test_unary_elementwise(npu, buffers, op, suffix, blocks):
    dtype = DTYPES[suffix]
    a = np.random.default_rng(blocks).uniform(-4, 4, ELEMENTWISE).astype(dtype)
    x, y = buffers.put(a), buffers.empty(dtype, ELEMENTWISE)
    npu.builtin(f"{op}_{suffix}").launch(blocks, x, y, ELEMENTWISE)
    npu.current_stream().synchronize()
    expected = np.maximum(a, dtype(0)) if op == "relu" else np.exp(a)
    close(buffers.get(y, dtype, ELEMENTWISE), expected, dtype)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("suffix", ["f32", "f16"])
def test_fill(npu, buffers, suffix, blocks):
    dtype = DTYPES[suffix]
    x = buffers.empty(dtype, ELEMENTWISE)
    npu.builtin(f"fill_{suffix}").launch(blocks, x, -2.5, ELEMENTWISE)
    npu.current_stream().synchronize()
    np.testing.assert_array_equal(
        buffers.get(x, dtype, ELEMENTWISE), np.full(ELEMENTWISE, -2.5, dtype)
    )


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("suffix", ["f32", "f16"])
def test_matmul(npu, buffers, suffix, blocks):
    dtype = DTYPES[suffix]
    m, k, n = 7, 13, 9
    rng = np.random.default_rng(blocks)
    a = rng.uniform(-1, 1, (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype)
    da, db, dc = buffers.put(a), buffers.put(b), buffers.empty(dtype, m * n)
    npu.builtin(f"matmul_{suffix}").launch(blocks, da, db, dc, m, k, n)
    npu.current_stream().synchronize()
    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)
    close(buffers.get(dc, dtype, m * n).reshape(m, n), expected, dtype)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("suffix", ["f32", "f16"])
def test_reduce_sum(npu, buffers, suffix, blocks):
    dtype = DTYPES[suffix]
    rows, cols = 11, 37
    x = np.random.default_rng(blocks).uniform(-1, 1, (rows, cols)).astype(dtype)
    dx, dy = buffers.put(x), buffers.empty(dtype, rows)
    npu.builtin(f"reduce_sum_{suffix}").launch(blocks, dx, dy, rows, cols)
    npu.current_stream().synchronize()
    expected = x.astype(np.float32).sum(axis=1).astype(dtype)
    close(buffers.get(dy, dtype, rows), expected, dtype)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("suffix", ["f32", "f16"])
def test_softmax(npu, buffers, suffix, blocks):
    dtype = DTYPES[suffix]
    rows, cols = 6, 33
    x = np.random.default_rng(blocks).uniform(-5, 5, (rows, cols)).astype(dtype)
    dx, dy = buffers.put(x), buffers.empty(dtype, rows * cols)
    npu.builtin(f"softmax_{suffix}").launch(blocks, dx, dy, rows, cols)
    npu.current_stream().synchronize()
    wide = x.astype(np.float32)
    e = np.exp(wide - wide.max(axis=1, keepdims=True))
    expected = (e / e.sum(axis=1, keepdims=True)).astype(dtype)
    result = buffers.get(dy, dtype, rows * cols).reshape(rows, cols)
    close(result, expected, dtype)
    close(result.astype(np.float32).sum(axis=1), np.ones(rows, np.float32), dtype)


@pytest.mark.parametrize("blocks", BLOCKS)
def test_empty(npu, rt, blocks):
    npu.builtin("empty").launch(blocks)
    npu.current_stream().synchronize()


def test_fewer_elements_than_blocks(npu, buffers):
    a = np.arange(3, dtype=np.float32)
    x, y = buffers.put(a), buffers.empty(np.float32, 3)
    npu.builtin("relu_f32").launch(5, x, y, 3)
    npu.builtin("matmul_f32").launch(5, x, x, y, 1, 1, 1)  # one row for five blocks
    npu.current_stream().synchronize()
    np.testing.assert_array_equal(buffers.get(y, np.float32, 3), [0.0, 1.0, 2.0])


# ---- user kernel modules ------------------------------------------------------------------------

BLOCK_INFO = '''
from simnpu import kernel


@kernel("ptr", "ptr", "ptr")
def who_am_i(ctx, counts, cores, nums):
    """Each block counts itself and notes its core and the block count."""
    ctx.gm(counts, "int32", ctx.block_num)[ctx.block_idx] += 1
    ctx.gm(cores, "int32", ctx.block_num)[ctx.block_idx] = ctx.core_id
    ctx.gm(nums, "int32", ctx.block_num)[ctx.block_idx] = ctx.block_num


def helper(ctx, counts, cores, nums):
    """Not a kernel: no @kernel."""
'''


def run_who_am_i(npu, module, blocks):
    counts, cores, nums = (npu.DeviceBuffer(4 * blocks) for _ in range(3))
    for buffer in (counts, cores, nums):
        buffer.fill(0xFF)
    counts.fill(0)
    module.function("who_am_i").launch(blocks, counts, cores, nums)
    npu.current_stream().synchronize()
    return counts.to_numpy(np.int32), cores.to_numpy(np.int32), nums.to_numpy(np.int32)


@pytest.mark.parametrize("blocks", [1, 2, 5, 64])
@pytest.mark.parametrize("origin", ["file", "source"])
def test_user_module_blocks_and_cores(npu, rt, tmp_path, origin, blocks):
    if origin == "file":
        path = tmp_path / "who.py"
        path.write_text(BLOCK_INFO)
        module = npu.Module.load(path)
    else:
        module = npu.Module.from_source(BLOCK_INFO, "who.py")
    counts, cores, nums = run_who_am_i(npu, module, blocks)
    assert list(counts) == [1] * blocks, "every block 0..n-1 runs exactly once"
    assert list(nums) == [blocks] * blocks
    assert set(cores) <= set(range(rt.ai_cores))
    if blocks >= 2 * rt.ai_cores:
        assert len(set(cores)) == rt.ai_cores, "a big launch is spread over every AI core"
    module.unload()


def test_only_kernel_functions_can_be_looked_up(npu, rt):
    module = npu.Module.from_source(BLOCK_INFO, "who.py")
    for name in ("helper", "kernel", "no_such_kernel", "np"):
        with pytest.raises(NpuError) as info:
            module.function(name)
        assert info.value.code == codes.ACL_ERROR_RT_KERNEL_LOOKUP == 507027
    with pytest.raises(NpuError) as info:
        npu.builtin("_binary")  # a helper of the built-in library
    assert info.value.code == codes.ACL_ERROR_RT_KERNEL_LOOKUP


@pytest.mark.parametrize(
    "source",
    [
        'from simnpu import kernel\nT = "ptr"\n\n@kernel(T, "u32")\ndef k(ctx, x, n):\n    pass\n',
        'from simnpu import kernel\n\n@kernel("ptr", "u" + "32")\ndef k(ctx, x, n):\n    pass\n',
        'from simnpu import kernel\n\n@kernel("ptr", "complex64")\ndef k(ctx, x):\n    pass\n',
        'from simnpu import kernel\n\n@kernel("ptr")\ndef k(ctx, x, n):\n    pass\n',
        'from simnpu import kernel\n\n@kernel("ptr")\ndef k(ctx, x:\n',
    ],
    ids=["variable", "expression", "unknown-type", "arity", "syntax"],
)
def test_bad_kernel_modules_do_not_load(npu, rt, tmp_path, source):
    with pytest.raises(NpuError) as info:
        npu.Module.from_source(source, "bad.py")
    assert info.value.code == codes.ACL_ERROR_INVALID_FILE == 100003
    assert "bad.py" in info.value.message
    path = tmp_path / "bad_file.py"
    path.write_text(source)
    with pytest.raises(NpuError) as info:
        npu.Module.load(path)
    assert info.value.code == codes.ACL_ERROR_INVALID_FILE


FAULTS = '''
import numpy as np
from simnpu import kernel


@kernel("ptr", "u32", "u32")
def raise_in_block(ctx, x, n, bad):
    if ctx.block_idx == bad:
        helper_that_fails(bad)
    ctx.gm(x, "float32", n)[ctx.block_idx] = 1.0


def helper_that_fails(bad):
    raise RuntimeError(f"kernel gave up in block {bad}")


@kernel("ptr", "u32")
def read_past_end(ctx, x, n):
    ctx.gm(x, "float32", n + 1, access="r")


@kernel("ptr", "u64")
def touch_address(ctx, x, address):
    """x is passed (and fine); `address` is an integer the kernel was not given as a ptr."""
    ctx.gm(address, "uint8", 1)[0] = 99


@kernel("ptr", "ptr")
def touch_second(ctx, x, other):
    ctx.gm(other, "uint8", 1)[0] = 99


@kernel("ptr", "u32")
def write_read_only(ctx, x, n):
    ctx.gm(x, "float32", n, access="r")[0] = 1.0


@kernel("ptr", "u32")
def read_only_is_readable(ctx, x, n):
    view = ctx.gm(x, "float32", n, access="r")
    total = float(view.sum())
    ctx.gm(x, "float32", n)[0] = total
'''


@pytest.fixture
def faults(npu, rt):
    return npu.Module.from_source(FAULTS, "faults.py")


def sync_error(npu) -> NpuError:
    with pytest.raises(NpuError) as info:
        npu.current_stream().synchronize()
    npu.current_stream().synchronize()  # reported once: the stream is usable again
    return info.value


def test_kernel_exception_reports_block_and_traceback(npu, faults):
    x = npu.DeviceBuffer(4 * 5)
    faults.function("raise_in_block").launch(5, x, 5, 2)
    error = sync_error(npu)
    assert error.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION == 507015
    assert "raise_in_block" in error.message and "block 2/5" in error.message
    assert "Traceback" in error.message and "helper_that_fails" in error.message
    assert "RuntimeError: kernel gave up in block 2" in error.message
    assert "faults.py" in error.message and os.path.basename(__file__) in error.message


def test_view_past_the_allocation_is_a_memory_fault(npu, faults):
    x = npu.DeviceBuffer(4 * 10)
    faults.function("read_past_end").launch(1, x, 10)
    error = sync_error(npu)
    assert error.code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR == 507053
    assert "read_past_end" in error.message
    faults.function("read_past_end").launch(1, x, 9)  # the last element is fine
    npu.current_stream().synchronize()


def test_kernel_sees_only_memory_it_was_given(npu, rt, faults):
    x, other = npu.DeviceBuffer(64), npu.DeviceBuffer(64)
    other.fill(7)
    faults.function("touch_address").launch(1, x, other.ptr)  # own memory, not passed as a ptr
    assert sync_error(npu).code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    faults.function("touch_address").launch(1, x, x.ptr + 64 + 64)  # just past x, wherever that is
    assert sync_error(npu).code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert (other.to_numpy() == 7).all()
    faults.function("touch_second").launch(1, x, other)  # passed: allowed
    npu.current_stream().synchronize()
    assert other.to_numpy()[0] == 99


def test_kernel_cannot_touch_another_clients_memory(npu, rt, faults, daemon, tmp_path):
    done = tmp_path / "done"
    other = start_client(
        daemon.address,
        f"""
        import os, time
        import numpy as np
        import simnpu.client as npu
        with npu.Device(0):
            buffer = npu.DeviceBuffer.from_array(np.full(64, 5, np.uint8))
            print(buffer.ptr, flush=True)
            deadline = time.monotonic() + 60
            while not os.path.exists({str(done)!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
            print(int((buffer.to_numpy() == 5).all()), flush=True)
    """,
    )
    try:
        address = int(other.stdout.readline())
        x = npu.DeviceBuffer(64)
        faults.function("touch_second").launch(1, x, address)
        error = sync_error(npu)
        assert error.code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
        faults.function("touch_address").launch(1, x, address)
        assert sync_error(npu).code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    finally:
        done.write_text("")
        out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert out.strip() == "1", "another client's memory was changed"


def test_read_only_views(npu, faults):
    data = np.arange(8, dtype=np.float32)
    x = npu.DeviceBuffer.from_array(data)
    faults.function("write_read_only").launch(1, x, 8)
    error = sync_error(npu)
    assert error.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "read-only" in error.message
    np.testing.assert_array_equal(x.to_numpy(np.float32), data)
    faults.function("read_only_is_readable").launch(1, x, 8)
    npu.current_stream().synchronize()
    assert x.to_numpy(np.float32)[0] == data.sum()


# ---- arguments --------------------------------------------------------------------------------

ARGUMENTS = '''
import numpy as np
from simnpu import kernel


@kernel("u8", "ptr", "u16", "f64", "i8", "f16", "i64", "u32", "f32", "i16", "u64")
def echo(ctx, a, out, b, c, d, e, f, g, h, i, j):
    """Writes every argument, as float64 and as raw int64, into out[0:11] and out[11:22]."""
    values = ctx.gm(out, "float64", 11)
    raw = ctx.gm(out + 88, "int64", 11)
    for index, value in enumerate((a, out, b, c, d, e, f, g, h, i, j)):
        values[index] = float(value)
        raw[index] = int(value) if float(value).is_integer() and abs(value) < 2 ** 63 else -1
'''

ECHO_VALUES = (
    0xAB,
    None,
    0xBEEF,
    -1.25e300,
    -128,
    1.5,
    -(2**62) - 7,
    0xDEADBEEF,
    3.25,
    -12345,
    2**64 - 1,
)


class EchoArgs(ctypes.Structure):
    """The C struct aclrtLaunchKernel's args buffer holds for `echo`."""

    _fields_ = [
        ("a", ctypes.c_uint8),
        ("out", ctypes.c_uint64),
        ("b", ctypes.c_uint16),
        ("c", ctypes.c_double),
        ("d", ctypes.c_int8),
        ("e", ctypes.c_uint16),
        ("f", ctypes.c_int64),
        ("g", ctypes.c_uint32),
        ("h", ctypes.c_float),
        ("i", ctypes.c_int16),
        ("j", ctypes.c_uint64),
    ]


def echo_struct(out_ptr: int) -> bytes:
    values = list(ECHO_VALUES)
    values[1] = out_ptr
    values[5] = int(np.float16(values[5]).view(np.uint16))
    return bytes(EchoArgs(*values))


def check_echo(out) -> None:
    got = out.to_numpy(np.float64)[:11]
    raw = out.to_numpy(np.int64)[11:22]
    expected = list(ECHO_VALUES)
    expected[1] = out.ptr
    assert got[0] == 0xAB and raw[0] == 0xAB
    assert raw[1] == out.ptr
    assert got[2] == 0xBEEF
    assert got[3] == -1.25e300
    assert raw[4] == -128
    assert got[5] == 1.5
    assert raw[6] == -(2**62) - 7
    assert raw[7] == 0xDEADBEEF
    assert got[8] == 3.25
    assert raw[9] == -12345
    assert got[10] == float(2**64 - 1)


@pytest.fixture
def echo(npu, rt):
    return npu.Module.from_source(ARGUMENTS, "args.py").function("echo")


def test_argument_struct_layout(npu, rt, echo):
    signature = echo.signature
    assert signature.offsets == (0, 8, 16, 24, 32, 34, 40, 48, 52, 56, 64)
    assert signature.size == ctypes.sizeof(EchoArgs) == 72
    out = npu.DeviceBuffer(8 * 22)
    values = list(ECHO_VALUES)
    values[1] = out
    echo.launch(1, *values)  # packed by the signature
    npu.current_stream().synchronize()
    check_echo(out)
    out.fill(0)
    rt.kernels.launch_kernel(echo.handle, 1, echo_struct(out.ptr), 0)  # a C struct built by hand
    npu.current_stream().synchronize()
    check_echo(out)


def test_an_array_given_for_a_kernel_argument_is_named(npu, rt, echo):
    """A numpy array where a kernel takes a pointer or a number: the ValueError a str gets
    too (the argument, its type, what was given), not numpy's own TypeError."""
    array = np.zeros(22, np.float32)
    values = list(ECHO_VALUES)
    values[1] = npu.DeviceBuffer(8 * 22)
    for index in (1, 2):  # a ptr, then a scalar parameter
        given = values.copy()
        given[index] = array
        with pytest.raises(ValueError, match=r"^echo: kernel argument ") as info:
            echo.launch(1, *given)
        kind = echo.signature.types[index]
        assert f"kernel argument {index} ({kind}) must be " in str(info.value)
        assert str(info.value).endswith(
            "not numpy.ndarray: copy host data to the device first "
            "(DeviceBuffer.from_array(array)) and pass the buffer"
            if kind == "ptr"
            else "must be a number, not numpy.ndarray"
        ), info.value
    pinned, given = npu.PinnedBuffer(8 * 22), values.copy()
    given[1] = pinned  # host memory: a kernel cannot take it
    with pytest.raises(ValueError, match=r"kernel argument 1 \(ptr\) must be a device pointer"):
        echo.launch(1, *given)
    pinned.free()
    echo.launch(1, *values)  # the kernel still launches
    npu.current_stream().synchronize()
    check_echo(values[1])
    values[1].free()


def test_launch_with_arguments_in_device_memory(npu, rt, echo):
    out = npu.DeviceBuffer(8 * 22)
    args = npu.DeviceBuffer.from_array(np.frombuffer(echo_struct(out.ptr), np.uint8))
    rt.kernels.launch_kernel_devargs(echo.handle, 1, args.ptr, args.nbytes, 0)
    npu.current_stream().synchronize()
    check_echo(out)


def test_device_arguments_are_read_in_stream_order(npu, rt, echo):
    """Arguments copied to the device asynchronously, then a launch that reads them, on one
    stream with no synchronize: the kernel reads them when it runs, after the copy.
    A slow kernel first makes sure nothing on the stream has run at submission."""
    nap = npu.Module.from_source(
        "import time\nfrom simnpu import kernel\n\n"
        "@kernel('f64')\ndef nap(ctx, s):\n    time.sleep(s)\n",
        "nap.py",
    ).function("nap")
    stream = npu.Stream()
    out = npu.DeviceBuffer(8 * 22)
    args = npu.DeviceBuffer(ctypes.sizeof(EchoArgs))
    args.fill(0)
    pinned = npu.PinnedBuffer(args.nbytes)
    pinned.array()[:] = np.frombuffer(echo_struct(out.ptr), np.uint8)
    nap.launch(1, 0.2, stream=stream)
    rt.memory.memcpy_async(
        args.ptr,
        args.nbytes,
        pinned.ptr,
        pinned.nbytes,
        codes.ACL_MEMCPY_HOST_TO_DEVICE,
        stream.handle,
    )
    rt.kernels.launch_kernel_devargs(echo.handle, 1, args.ptr, args.nbytes, stream.handle)
    stream.synchronize()
    check_echo(out)
    pinned.free()


def test_device_arguments_freed_before_the_launch_runs(npu, rt, echo):
    """aclrtFree does not wait for tasks: arguments freed while the launch waits behind a
    gate cannot be read when it runs. The launch fails; the stream goes on."""
    gate = npu.Module.from_source(GATE, "gate.py").function("gate")
    flag = npu.DeviceBuffer(4)
    flag.fill(0)
    out = npu.DeviceBuffer(8 * 22)
    args = npu.DeviceBuffer.from_array(np.frombuffer(echo_struct(out.ptr), np.uint8))
    gate.launch(1, flag, 20.0)
    rt.kernels.launch_kernel_devargs(echo.handle, 1, args.ptr, args.nbytes, 0)
    npu.builtin("fill_f32").launch(1, out, 4.0, 1)
    args.free()
    rt.memory.memset(flag.ptr, 4, 1, 4)
    with pytest.raises(NpuError) as info:
        npu.current_stream().synchronize()
    assert info.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert "echo" in info.value.message
    assert out.to_numpy(np.float32)[0] == 4.0  # the launch after it ran


# ---- unloading -----------------------------------------------------------------------------------


def test_unload_invalidates_the_binary_and_its_functions(npu, rt):
    module = npu.Module.from_source(BLOCK_INFO, "who.py")
    kernel = module.function("who_am_i")
    assert list(run_who_am_i(npu, module, 2)[0]) == [1, 1]
    module.unload()
    with pytest.raises(NpuError) as info:
        module.function("who_am_i")
    assert info.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE == 107017
    buffer = npu.DeviceBuffer(64)
    with pytest.raises(NpuError) as info:
        kernel.launch(1, buffer, buffer, buffer)
    assert info.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    npu.current_stream().synchronize()  # nothing was queued, nothing failed
    with pytest.raises(NpuError) as info:
        module.unload()
    assert info.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    # The same source loads again, as a new binary.
    again = npu.Module.from_source(BLOCK_INFO, "who.py")
    assert again.handle != module.handle
    assert list(run_who_am_i(npu, again, 3)[0]) == [1, 1, 1]


def test_builtin_library_cannot_be_unloaded(npu, rt):
    with pytest.raises(NpuError) as info:
        rt.kernels.binary_unload(1)
    assert info.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    npu.builtin("empty").launch(1)
    npu.current_stream().synchronize()


def test_many_small_launches_in_order(npu, buffers):
    """A long run of single-block launches on one stream (handed to a core together)."""
    x = buffers.put(np.zeros(16, np.float32))
    one = buffers.put(np.ones(16, np.float32))
    add = npu.builtin("add_f32")
    for _ in range(300):
        add.launch(1, x, one, x, 16)
    npu.current_stream().synchronize()
    np.testing.assert_array_equal(buffers.get(x, np.float32, 16), np.full(16, 300, np.float32))
