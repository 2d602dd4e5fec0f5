"""The built-in kernels, written exactly as a user writes a kernel module.

Every kernel splits its work over the blocks of the launch: block `ctx.block_idx` of
`ctx.block_num` handles one contiguous slice of the elements (elementwise kernels) or of
the rows (row-wise kernels), and a block whose slice is empty does nothing. Views cover
only the slice a block touches; inputs are read-only. Results are written through `out=`,
so the f32 kernels allocate nothing of the data's size; the f16 matmul, reduce_sum and
softmax compute in float32 and round once at the end. In the saturation mode
(aclrtSetDeviceSatMode) every kernel saturates the float results it wrote (`ctx.saturate`).
"""

import numpy as np

from simnpu import kernel

_ACC = np.float32  # what f16 matmul, reduce_sum and softmax compute in (matmul: BLAS sgemm)


def _block_range(ctx, total):
    """The slice [start, stop) of `total` items that this block handles (balanced split)."""
    base, extra = divmod(total, ctx.block_num)
    start = ctx.block_idx * base + min(ctx.block_idx, extra)
    return start, start + base + (ctx.block_idx < extra)


def _view(ctx, ptr, dtype, first, count, access="rw"):
    """Elements [first, first + count) of the `dtype` array at `ptr`; nothing mapped if empty."""
    if count == 0:
        return np.empty(0, dtype)
    return ctx.gm(ptr + first * np.dtype(dtype).itemsize, dtype, count, access=access)


def _binary(ctx, ufunc, dtype, x, y, z, n):
    start, stop = _block_range(ctx, n)
    if start < stop:
        a = _view(ctx, x, dtype, start, stop - start, access="r")
        b = _view(ctx, y, dtype, start, stop - start, access="r")
        out = _view(ctx, z, dtype, start, stop - start)
        ufunc(a, b, out=out)
        ctx.saturate(out)


def _unary(ctx, ufunc, dtype, x, y, n, *operands):
    start, stop = _block_range(ctx, n)
    if start < stop:
        a = _view(ctx, x, dtype, start, stop - start, access="r")
        out = _view(ctx, y, dtype, start, stop - start)
        ufunc(a, *operands, out=out)
        ctx.saturate(out)


def _fill(ctx, dtype, x, value, n):
    start, stop = _block_range(ctx, n)
    if start < stop:
        out = _view(ctx, x, dtype, start, stop - start)
        out.fill(value)
        ctx.saturate(out)


def _rows(ctx, dtype, x, y, rows, cols, y_cols):
    """This block's rows of x[rows, cols] and y[rows, y_cols], or None if it has none."""
    start, stop = _block_range(ctx, rows)
    if start == stop:
        return None
    count = stop - start
    xs = _view(ctx, x, dtype, start * cols, count * cols, access="r")
    ys = _view(ctx, y, dtype, start * y_cols, count * y_cols)
    return xs.reshape(count, cols), ys.reshape(count, y_cols)


def _matmul(ctx, dtype, a, b, c, m, k, n):
    block = _rows(ctx, dtype, a, c, m, k, n)
    if block is not None:
        a_rows, c_rows = block
        b_all = _view(ctx, b, dtype, 0, k * n, access="r").reshape(k, n)
        np.matmul(a_rows, b_all, out=c_rows, dtype=_ACC)
        ctx.saturate(c_rows)


def _reduce_sum(ctx, dtype, x, y, rows, cols):
    block = _rows(ctx, dtype, x, y, rows, cols, 1)
    if block is not None:
        x_rows, y_rows = block
        np.sum(x_rows, axis=1, dtype=_ACC, out=y_rows[:, 0])
        ctx.saturate(y_rows)


def _softmax(ctx, dtype, x, y, rows, cols):
    block = _rows(ctx, dtype, x, y, rows, cols, cols)
    if block is None or cols == 0:
        return
    x_rows, y_rows = block
    work = y_rows if y_rows.dtype == _ACC else np.empty(y_rows.shape, _ACC)
    np.subtract(x_rows, x_rows.max(axis=1, keepdims=True), out=work)
    np.exp(work, out=work)
    np.divide(work, work.sum(axis=1, keepdims=True), out=work)
    if work is not y_rows:
        np.copyto(y_rows, work, casting="same_kind")
    ctx.saturate(y_rows)


# --- kernels ---------------------------------------------------------------------------------


@kernel()
def empty(ctx):
    """Does nothing: the cost of a launch alone."""


@kernel("ptr", "ptr", "ptr", "u32")
def add_f32(ctx, x, y, z, n):
    """z[i] = x[i] + y[i] for i < n."""
    _binary(ctx, np.add, "float32", x, y, z, n)


@kernel("ptr", "ptr", "ptr", "u32")
def add_f16(ctx, x, y, z, n):
    """z[i] = x[i] + y[i] for i < n."""
    _binary(ctx, np.add, "float16", x, y, z, n)


@kernel("ptr", "ptr", "ptr", "u32")
def mul_f32(ctx, x, y, z, n):
    """z[i] = x[i] * y[i] for i < n."""
    _binary(ctx, np.multiply, "float32", x, y, z, n)


@kernel("ptr", "ptr", "ptr", "u32")
def mul_f16(ctx, x, y, z, n):
    """z[i] = x[i] * y[i] for i < n."""
    _binary(ctx, np.multiply, "float16", x, y, z, n)


@kernel("ptr", "ptr", "u32")
def relu_f32(ctx, x, y, n):
    """y[i] = max(x[i], 0) for i < n."""
    _unary(ctx, np.maximum, "float32", x, y, n, 0)


@kernel("ptr", "ptr", "u32")
def relu_f16(ctx, x, y, n):
    """y[i] = max(x[i], 0) for i < n."""
    _unary(ctx, np.maximum, "float16", x, y, n, 0)


@kernel("ptr", "ptr", "u32")
def exp_f32(ctx, x, y, n):
    """y[i] = e ** x[i] for i < n."""
    _unary(ctx, np.exp, "float32", x, y, n)


@kernel("ptr", "ptr", "u32")
def exp_f16(ctx, x, y, n):
    """y[i] = e ** x[i] for i < n."""
    _unary(ctx, np.exp, "float16", x, y, n)


@kernel("ptr", "ptr", "ptr", "u32", "u32", "u32")
def matmul_f32(ctx, a, b, c, m, k, n):
    """c[m, n] = a[m, k] @ b[k, n], all row-major; blocks split the rows of c."""
    _matmul(ctx, "float32", a, b, c, m, k, n)


@kernel("ptr", "ptr", "ptr", "u32", "u32", "u32")
def matmul_f16(ctx, a, b, c, m, k, n):
    """c[m, n] = a[m, k] @ b[k, n], all row-major, accumulated in float32."""
    _matmul(ctx, "float16", a, b, c, m, k, n)


@kernel("ptr", "ptr", "u32", "u32")
def reduce_sum_f32(ctx, x, y, rows, cols):
    """y[r] = sum of row r of x[rows, cols]; blocks split the rows."""
    _reduce_sum(ctx, "float32", x, y, rows, cols)


@kernel("ptr", "ptr", "u32", "u32")
def reduce_sum_f16(ctx, x, y, rows, cols):
    """y[r] = sum of row r of x[rows, cols], accumulated in float32."""
    _reduce_sum(ctx, "float16", x, y, rows, cols)


@kernel("ptr", "ptr", "u32", "u32")
def softmax_f32(ctx, x, y, rows, cols):
    """y[r] = softmax of row r of x[rows, cols] (max-subtracted); blocks split the rows."""
    _softmax(ctx, "float32", x, y, rows, cols)


@kernel("ptr", "ptr", "u32", "u32")
def softmax_f16(ctx, x, y, rows, cols):
    """y[r] = softmax of row r of x[rows, cols], computed in float32."""
    _softmax(ctx, "float16", x, y, rows, cols)


@kernel("ptr", "f32", "u32")
def fill_f32(ctx, x, value, n):
    """x[i] = value for i < n."""
    _fill(ctx, "float32", x, value, n)


@kernel("ptr", "f16", "u32")
def fill_f16(ctx, x, value, n):
    """x[i] = value for i < n."""
    _fill(ctx, "float16", x, value, n)
