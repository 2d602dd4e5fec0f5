"""The built-in kernels, run block by block on a fake device against numpy references."""

import inspect
import itertools

import numpy as np
import pytest

from simnpu.proto.kernel_abi import discover_kernels, is_kernel, signature_of
from simnpu.server.kernels import builtin
from simnpu.server.units.float_overflow import saturate

BLOCK_NUMS = [1, 3, 7]
SIZES = [0, 1, 2, 10, 21, 1000]  # empty, fewer than the blocks, not divisible, divisible
TAIL = 3  # elements past the end of each buffer that no kernel may touch
TOLERANCE = {
    np.float32: {"rtol": 1e-5, "atol": 1e-6},
    np.float16: {"rtol": 2e-3, "atol": 1e-3},
}


class FakeDevice:
    """Device memory made of the test's numpy arrays, at fake device addresses.

    Records every view a kernel takes, so tests can check which block touched what.
    """

    def __init__(self):
        self._next = 1 << 47
        self.buffers = {}  # address -> uint8 array
        self.views = []  # (block_idx, address, first byte, end byte, access)

    def put(self, array):
        """Copy `array` (plus TAIL NaN elements after it) to the device; its address."""
        array = np.ascontiguousarray(array).reshape(-1)
        padded = np.full(array.size + TAIL, np.nan, array.dtype)
        padded[: array.size] = array
        address = self._next
        self.buffers[address] = padded.view(np.uint8)
        self._next += (padded.nbytes // 4096 + 2) * 4096
        return address

    def alloc(self, dtype, count):
        return self.put(np.full(count, np.nan, dtype))

    def get(self, address, dtype, count):
        """The first `count` elements of the buffer at `address` (and asserts its tail is
        intact)."""
        data = self.buffers[address].view(dtype)
        assert np.isnan(data[count:]).all(), "a kernel wrote past the elements it was given"
        return data[:count].copy()

    def gm(self, block_idx, ptr, dtype, count, access):
        assert access in ("r", "rw")
        dtype = np.dtype(dtype)
        base = max((a for a in self.buffers if a <= ptr), default=None)
        assert base is not None, f"{ptr:#x} is not device memory"
        first = ptr - base
        end = first + count * dtype.itemsize
        assert first % dtype.itemsize == 0, "misaligned view"
        assert 0 <= first < end <= self.buffers[base].size, "view out of its allocation"
        self.views.append((block_idx, base, first, end, access))
        view = self.buffers[base][first:end].view(dtype)
        view.flags.writeable = access == "rw"
        return view


class FakeContext:
    def __init__(self, device, block_idx, block_num, saturation=False):
        self._device = device
        self.block_idx = block_idx
        self.block_num = block_num
        self.core_id = block_idx % 2
        self.saturation = saturation

    def gm(self, ptr, dtype, count, access="rw"):
        return self._device.gm(self.block_idx, ptr, dtype, count, access)

    def saturate(self, values):
        if self.saturation:
            saturate(values)


def launch(device, fn, block_num, *args, reads=(), work_items):
    """Run every block of `fn` (in reverse order: blocks are independent) on packed args.

    Checks that the kernel views only the buffers it was given, the ones in `reads`
    read-only and unchanged; that no two blocks write the same bytes; and that exactly
    min(block_num, work_items) blocks did anything.
    """
    signature = signature_of(fn)
    args = signature.unpack(signature.pack(*args))
    given = {arg for name, arg in zip(signature.types, args, strict=True) if name == "ptr"}
    before = {address: device.buffers[address].copy() for address in reads}
    for block_idx in reversed(range(block_num)):
        fn(FakeContext(device, block_idx, block_num), *args)
    for address, data in before.items():
        assert (device.buffers[address] == data).all(), "an input changed"
    for _, address, _, _, access in device.views:
        assert address in given, "a view outside the kernel's buffers"
        assert (access == "r") == (address in reads), "inputs read-only, outputs writable"
    written = sorted((v[1], v[2], v[3], v[0]) for v in device.views if v[4] == "rw")
    for (addr_a, _, end_a, block_a), (addr_b, first_b, _, block_b) in itertools.pairwise(written):
        assert addr_a != addr_b or end_a <= first_b, f"blocks {block_a} and {block_b} overlap"
    assert len({v[0] for v in device.views}) == min(block_num, work_items)


def close(actual, expected, dtype):
    np.testing.assert_allclose(actual, expected, equal_nan=False, **TOLERANCE[dtype])


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


DTYPES = {np.float32: "f32", np.float16: "f16"}


def kernel_for(name, dtype):
    return getattr(builtin, f"{name}_{DTYPES[dtype]}")


# --- elementwise --------------------------------------------------------------------------------

BINARY = {"add": np.add, "mul": np.multiply}
UNARY = {"relu": lambda x: np.maximum(x, 0), "exp": np.exp}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block_num", BLOCK_NUMS)
def test_binary(rng, dtype, name, n, block_num):
    device = FakeDevice()
    x_host = rng.standard_normal(n).astype(dtype)
    y_host = rng.standard_normal(n).astype(dtype)
    x, y, z = device.put(x_host), device.put(y_host), device.alloc(dtype, n)
    launch(device, kernel_for(name, dtype), block_num, x, y, z, n, reads=(x, y), work_items=n)
    expected = BINARY[name](x_host.astype(np.float64), y_host.astype(np.float64))
    close(device.get(z, dtype, n), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block_num", BLOCK_NUMS)
def test_unary(rng, dtype, name, n, block_num):
    device = FakeDevice()
    x_host = rng.standard_normal(n).astype(dtype)
    x, y = device.put(x_host), device.alloc(dtype, n)
    launch(device, kernel_for(name, dtype), block_num, x, y, n, reads=(x,), work_items=n)
    close(device.get(y, dtype, n), UNARY[name](x_host.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0.0, -2.5, 0.1])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block_num", BLOCK_NUMS)
def test_fill(dtype, value, n, block_num):
    device = FakeDevice()
    x = device.alloc(dtype, n)
    launch(device, kernel_for("fill", dtype), block_num, x, value, n, work_items=n)
    assert (device.get(x, dtype, n) == dtype(value)).all()


def test_elementwise_kernels_may_work_in_place(rng):
    device = FakeDevice()
    host = rng.standard_normal(50).astype(np.float32)
    x = device.put(host)
    for block_idx in range(3):
        builtin.add_f32(FakeContext(device, block_idx, 3), x, x, x, 50)
    np.testing.assert_array_equal(device.get(x, np.float32, 50), host * 2)


# --- row-wise -----------------------------------------------------------------------------------

MATMUL_SHAPES = [(1, 1, 1), (2, 3, 4), (10, 7, 5), (21, 16, 9), (4, 0, 3), (5, 3, 0), (0, 4, 4)]
ROW_SHAPES = [(1, 1), (2, 5), (10, 7), (22, 33), (0, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "k", "n"), MATMUL_SHAPES)
@pytest.mark.parametrize("block_num", BLOCK_NUMS)
def test_matmul(rng, dtype, m, k, n, block_num):
    device = FakeDevice()
    a_host = rng.uniform(-1, 1, (m, k)).astype(dtype)
    b_host = rng.uniform(-1, 1, (k, n)).astype(dtype)
    a, b, c = device.put(a_host), device.put(b_host), device.alloc(dtype, m * n)
    matmul = kernel_for("matmul", dtype)
    launch(device, matmul, block_num, a, b, c, m, k, n, reads=(a, b), work_items=m)
    expected = a_host.astype(np.float64) @ b_host.astype(np.float64)
    close(device.get(c, dtype, m * n).reshape(m, n), expected, dtype)


def test_matmul_f16_accumulates_in_float32():
    device = FakeDevice()
    k = 4096  # a float16 accumulator stops growing at 2048
    a, b = device.put(np.ones(k, np.float16)), device.put(np.ones(k, np.float16))
    c = device.alloc(np.float16, 1)
    builtin.matmul_f16(FakeContext(device, 0, 1), a, b, c, 1, k, 1)
    assert device.get(c, np.float16, 1)[0] == k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "cols"), [*ROW_SHAPES, (5, 0)])
@pytest.mark.parametrize("block_num", BLOCK_NUMS)
def test_reduce_sum(rng, dtype, rows, cols, block_num):
    device = FakeDevice()
    x_host = rng.uniform(0, 1, (rows, cols)).astype(dtype)
    x, y = device.put(x_host), device.alloc(dtype, rows)
    reduce_sum = kernel_for("reduce_sum", dtype)
    launch(device, reduce_sum, block_num, x, y, rows, cols, reads=(x,), work_items=rows)
    close(device.get(y, dtype, rows), x_host.astype(np.float64).sum(axis=1), dtype)


def test_reduce_sum_f16_accumulates_in_float32():
    device = FakeDevice()
    x, y = device.put(np.ones(4096, np.float16)), device.alloc(np.float16, 1)
    builtin.reduce_sum_f16(FakeContext(device, 0, 1), x, y, 1, 4096)
    assert device.get(y, np.float16, 1)[0] == 4096


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "cols"), ROW_SHAPES)
@pytest.mark.parametrize("block_num", BLOCK_NUMS)
def test_softmax(rng, dtype, rows, cols, block_num):
    device = FakeDevice()
    # around 200: exp() of the raw values overflows both float16 and float32
    x_host = (rng.standard_normal((rows, cols)) * 3 + 200).astype(dtype)
    x, y = device.put(x_host), device.alloc(dtype, rows * cols)
    softmax = kernel_for("softmax", dtype)
    launch(device, softmax, block_num, x, y, rows, cols, reads=(x,), work_items=rows)
    shifted = np.exp(x_host.astype(np.float64) - x_host.max(axis=1, keepdims=True))
    expected = shifted / shifted.sum(axis=1, keepdims=True)
    close(device.get(y, dtype, rows * cols).reshape(rows, cols), expected, dtype)


def test_softmax_of_empty_rows_touches_nothing():
    device = FakeDevice()
    x, y = device.alloc(np.float32, 0), device.alloc(np.float32, 0)
    for block_idx in range(3):
        builtin.softmax_f32(FakeContext(device, block_idx, 3), x, y, 5, 0)
    assert device.views == []


@pytest.mark.parametrize("saturation", [False, True])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_the_saturation_mode_saturates_every_float_result(saturation):
    """Overflow gives +-inf and NaN in the Inf/NaN mode, the largest finite value and 0 in
    the saturation mode: elementwise, matmul, reduce_sum and fill alike."""
    device = FakeDevice()
    f16 = np.finfo(np.float16).max
    x = device.put(np.array([60000, -60000, np.inf, 1], np.float16))
    y = device.put(np.array([60000, -60000, -np.inf, 2], np.float16))
    cases = [  # (kernel, its arguments after the output, the output's count, Inf/NaN, saturated)
        (builtin.add_f16, (x, y), 4, [np.inf, -np.inf, np.nan, 3], [f16, -f16, 0, 3]),
        (builtin.mul_f16, (x, y), 4, [np.inf, np.inf, -np.inf, 2], [f16, f16, -f16, 2]),
        (builtin.exp_f16, (x,), 4, [np.inf, 0, np.inf, np.e], [f16, 0, f16, np.e]),
    ]
    for fn, inputs, n, inf_nan, saturated in cases:
        out = device.alloc(np.float16, n)
        for block_idx in range(2):
            fn(FakeContext(device, block_idx, 2, saturation), *inputs, out, n)
        expected = np.array(saturated if saturation else inf_nan, np.float16)
        np.testing.assert_array_equal(device.get(out, np.float16, n), expected)
    ones = device.put(np.full(4, 60000, np.float16))
    total = device.alloc(np.float16, 1)
    builtin.reduce_sum_f16(FakeContext(device, 0, 1, saturation), ones, total, 1, 4)
    builtin.matmul_f16(FakeContext(device, 0, 1, saturation), ones, ones, total, 1, 4, 1)
    assert device.get(total, np.float16, 1)[0] == (f16 if saturation else np.inf)
    big = device.alloc(np.float32, 3)
    builtin.fill_f32(FakeContext(device, 0, 1, saturation), big, np.float32(np.inf), 3)
    limit = np.finfo(np.float32).max if saturation else np.inf
    assert (device.get(big, np.float32, 3) == limit).all()


def test_empty_does_nothing():
    device = FakeDevice()
    for block_num in BLOCK_NUMS:
        for block_idx in range(block_num):
            assert builtin.empty(FakeContext(device, block_idx, block_num)) is None
    assert device.views == []


# --- the module as a kernel module --------------------------------------------------------------

EXPECTED_SIGNATURES = {
    "empty": "",
    **{f"{op}_{t}": "ptr,ptr,ptr,u32" for op in ("add", "mul") for t in ("f32", "f16")},
    **{f"{op}_{t}": "ptr,ptr,u32" for op in ("relu", "exp") for t in ("f32", "f16")},
    "matmul_f32": "ptr,ptr,ptr,u32,u32,u32",
    "matmul_f16": "ptr,ptr,ptr,u32,u32,u32",
    "reduce_sum_f32": "ptr,ptr,u32,u32",
    "reduce_sum_f16": "ptr,ptr,u32,u32",
    "softmax_f32": "ptr,ptr,u32,u32",
    "softmax_f16": "ptr,ptr,u32,u32",
    "fill_f32": "ptr,f32,u32",
    "fill_f16": "ptr,f16,u32",
}


def test_discovery_lists_exactly_the_kernels_the_module_defines():
    discovered = discover_kernels(inspect.getsource(builtin), builtin.__file__)
    defined = {name: signature_of(obj) for name, obj in vars(builtin).items() if is_kernel(obj)}
    assert discovered == defined
    assert {name: sig.to_wire() for name, sig in discovered.items()} == EXPECTED_SIGNATURES


def test_every_kernel_is_tested_here():
    tested = {"empty"} | {
        f"{name}_{suffix}"
        for name in [*BINARY, *UNARY, "fill", "matmul", "reduce_sum", "softmax"]
        for suffix in DTYPES.values()
    }
    assert tested == set(EXPECTED_SIGNATURES)
