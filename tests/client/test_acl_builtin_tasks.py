"""acl.rt.reduce_async and acl.rt.random_num_async through `acl` against a real daemon:
values against numpy, every kind and data type, stream order, the runtime's codes for bad
arguments, and that bad input leaves the daemon and other clients unharmed."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
from conftest import run_client

from simnpu.proto import codes

REDUCE_TYPES = {
    codes.ACL_FLOAT: np.float32,
    codes.ACL_FLOAT16: np.float16,
    codes.ACL_INT16: np.int16,
    codes.ACL_INT8: np.int8,
    codes.ACL_INT32: np.int32,
    codes.ACL_BF16: ml_dtypes.bfloat16,
    codes.ACL_UINT8: np.uint8,
    codes.ACL_UINT16: np.uint16,
    codes.ACL_UINT32: np.uint32,
}
KINDS = {
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM: np.add,
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_MAX: np.maximum,
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_MIN: np.minimum,
}
SUM = codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM


def put(acl, data: bytes) -> int:
    ptr, ret = acl.rt.malloc(len(data), 0)
    assert ret == 0
    ret = acl.rt.memcpy(
        ptr, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
    )
    assert ret == 0
    return ptr


def get(acl, ptr: int, size: int) -> bytes:
    out = bytes(size)
    ret = acl.rt.memcpy(acl.util.bytes_to_ptr(out), size, ptr, size, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    assert ret == 0
    return out


# ---- aclrtReduceAsync ---------------------------------------------------------------------------
def test_reduce_every_kind_and_type_matches_numpy(acl):
    """dst = dst (op) src element-wise; integers wrap, as on the device."""
    stream, _ = acl.rt.create_stream()
    rng = np.random.default_rng(5)
    for data_type, dtype in REDUCE_TYPES.items():
        if np.dtype(dtype).kind in "iu":
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, 1000, endpoint=True).astype(dtype)
            b = rng.integers(info.min, info.max, 1000, endpoint=True).astype(dtype)
        else:
            a = (rng.standard_normal(1000) * 100).astype(dtype)
            b = (rng.standard_normal(1000) * 100).astype(dtype)
        for kind, ufunc in KINDS.items():
            dst, src = put(acl, a.tobytes()), put(acl, b.tobytes())
            ret = acl.rt.reduce_async(dst, src, a.nbytes, kind, data_type, stream, 0)
            assert ret == 0, (data_type, kind)
            assert acl.rt.synchronize_stream(stream) == 0
            with np.errstate(over="ignore"):
                expected = ufunc(a, b)
            got = np.frombuffer(get(acl, dst, a.nbytes), dtype)
            assert got.tobytes() == expected.tobytes(), (data_type, kind)
            assert get(acl, src, b.nbytes) == b.tobytes()  # the source is only read
            acl.rt.free(dst)
            acl.rt.free(src)
    acl.rt.destroy_stream(stream)


def test_reduces_run_in_stream_order(acl):
    """A reduce sees the copy queued before it and the one after sees its result."""
    stream, _ = acl.rt.create_stream()
    ones = np.ones(1 << 16, np.int32)
    dst, src = put(acl, bytes(ones.nbytes)), put(acl, ones.tobytes())
    host, ret = acl.rt.malloc_host(ones.nbytes)
    assert ret == 0
    for _ in range(5):
        assert acl.rt.reduce_async(dst, src, ones.nbytes, SUM, codes.ACL_INT32, stream, 0) == 0
    tripled = (ones * 3).tobytes()
    staged = put(acl, tripled)
    assert acl.rt.memcpy_async(src, ones.nbytes, staged, ones.nbytes, 3, stream) == 0
    assert acl.rt.reduce_async(dst, src, ones.nbytes, SUM, codes.ACL_INT32, stream, 0) == 0
    assert acl.rt.memcpy_async(host, ones.nbytes, dst, ones.nbytes, 2, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    got = np.frombuffer(get(acl, dst, ones.nbytes), np.int32)
    assert set(got.tolist()) == {8}
    for ptr in (dst, src, staged):
        acl.rt.free(ptr)
    acl.rt.free_host(host)
    acl.rt.destroy_stream(stream)


def test_a_float_sum_that_overflows_gives_inf_and_sets_the_overflow_status(acl):
    stream, _ = acl.rt.create_stream()
    big = np.full(64, 60000, np.float16)
    dst, src = put(acl, big.tobytes()), put(acl, big.tobytes())
    status = put(acl, bytes(64))
    assert acl.rt.reset_overflow_status(stream) == 0
    assert acl.rt.reduce_async(dst, src, big.nbytes, SUM, codes.ACL_FLOAT16, stream, 0) == 0
    assert acl.rt.get_overflow_status(status, 64, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.all(np.isinf(np.frombuffer(get(acl, dst, big.nbytes), np.float16)))
    assert int.from_bytes(get(acl, status, 8), "little") == 1
    assert acl.rt.reset_overflow_status(stream) == 0
    for ptr in (dst, src, status):
        acl.rt.free(ptr)
    acl.rt.destroy_stream(stream)


def test_reduce_bad_arguments_get_the_runtimes_codes(acl, daemon):
    stream, _ = acl.rt.create_stream()
    dst, src = put(acl, bytes(64)), put(acl, bytes(64))
    f32 = codes.ACL_FLOAT
    bad = {
        (0, src, 64, SUM, f32, stream, 0): codes.ACL_ERROR_INVALID_PARAM,
        (dst, 0, 64, SUM, f32, stream, 0): codes.ACL_ERROR_INVALID_PARAM,
        (dst, src, 64, SUM, f32, stream, 1): codes.ACL_ERROR_INVALID_PARAM,
        (dst, src, 64, SUM, codes.ACL_DOUBLE, stream, 0): codes.ACL_ERROR_INVALID_PARAM,
        (dst, src, 64, SUM, codes.ACL_INT64, stream, 0): codes.ACL_ERROR_INVALID_PARAM,
        (dst, src, 0, SUM, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 64, 9, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 64, 14, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 64, -1, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 64, 13, f32, stream, 0): codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
        (dst, src, 64, SUM, codes.ACL_INT4, stream, 0): codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
        (dst + 2, src, 60, SUM, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src + 1, 60, SUM, codes.ACL_INT16, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 62, SUM, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 128, SUM, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, 0x1234_5678, 64, SUM, f32, stream, 0): codes.ACL_ERROR_RT_PARAM_INVALID,
        (dst, src, 64, SUM, f32, 0x4444, 0): codes.ACL_ERROR_RT_INVALID_HANDLE,
    }
    for args, code in bad.items():
        assert acl.rt.reduce_async(*args) == code, args
    with pytest.raises(TypeError):
        acl.rt.reduce_async(dst, src, 64, SUM, f32, stream, None)
    assert acl.rt.synchronize_stream(stream) == 0  # nothing bad was queued
    assert acl.rt.reduce_async(dst, src, 64, SUM, f32, stream, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    for ptr in (dst, src):
        acl.rt.free(ptr)
    acl.rt.destroy_stream(stream)
    # another client's memory is not this client's to reduce into
    other = run_client(
        daemon.address,
        f"""
import acl
acl.init(); acl.rt.set_device(0)
print(acl.rt.reduce_async({dst}, {src}, 64, 10, 0, 0, 0))
acl.rt.reset_device(0); acl.finalize()
""",
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == [str(codes.ACL_ERROR_RT_PARAM_INVALID)]


# ---- aclrtRandomNumAsync ------------------------------------------------------------------------
def value(data: bytes) -> dict:
    return {"is_addr": 0, "value_or_addr": data, "size": len(data)}


def address(ptr: int) -> dict:
    return {"is_addr": 1, "value_or_addr": ptr, "size": 8}


def task(data_type, func_type, params, result, counter, seed=0, num=1024, member=None):
    member = member or {
        0: "dropout_bitmask_info",
        1: "uniform_dis_info",
        2: "normal_dis_info",
        3: "normal_dis_info",
    }.get(func_type, "uniform_dis_info")
    names = {
        "dropout_bitmask_info": ("dropout_ration",),
        "uniform_dis_info": ("min", "max"),
        "normal_dis_info": ("mean", "stddev"),
    }[member]
    return {
        "data_type": data_type,
        "random_num_func_para_info": {
            "func_type": func_type,
            "param_info": {member: dict(zip(names, params))},
        },
        "random_para_addr": 0,
        "random_result_addr": result,
        "random_counter_addr": counter,
        "random_seed": seed if isinstance(seed, dict) else value(struct.pack("<Q", seed)),
        "random_num": num if isinstance(num, dict) else value(struct.pack("<Q", num)),
    }


@pytest.fixture
def buffers(acl):
    stream, _ = acl.rt.create_stream()
    result, _ = acl.rt.malloc(8 * 4096, 0)
    counter = put(acl, bytes(16))
    yield stream, result, counter
    acl.rt.free(result)
    acl.rt.free(counter)
    acl.rt.destroy_stream(stream)


def run(acl, info, stream, size):
    assert acl.rt.random_num_async(info, stream, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    return get(acl, info["random_result_addr"], size)


def test_uniform_integers_are_in_range_for_every_integer_type(acl, buffers):
    stream, result, counter = buffers
    for data_type, dtype, low, high in (
        (codes.ACL_INT32, np.int32, -5, 7),
        (codes.ACL_UINT32, np.uint32, 1 << 31, (1 << 32) - 1),
        (codes.ACL_INT64, np.int64, -(1 << 40), 1 << 40),
        (codes.ACL_UINT64, np.uint64, 3, 1 << 63),
    ):
        bounds = [value(np.array([v], dtype).tobytes()) for v in (low, high)]
        info = task(data_type, 1, bounds, result, counter)
        got = np.frombuffer(run(acl, info, stream, 1024 * np.dtype(dtype).itemsize), dtype)
        assert int(got.min()) >= low and int(got.max()) < high, data_type
        assert len(set(got.tolist())) == (12 if high - low < 100 else 1024)


def test_uniform_and_normal_floats_for_every_float_type(acl, buffers):
    stream, result, counter = buffers
    for data_type, dtype in (
        (codes.ACL_FLOAT, np.float32),
        (codes.ACL_FLOAT16, np.float16),
        (codes.ACL_BF16, ml_dtypes.bfloat16),
    ):
        size = np.dtype(dtype).itemsize
        two = [value(np.array([v], dtype).tobytes()) for v in (2.0, 4.0)]
        info = task(data_type, 1, two, result, counter, num=4096)
        got = np.frombuffer(run(acl, info, stream, 4096 * size), dtype).astype(np.float64)
        assert got.min() >= 2.0 and got.max() <= 4.0 and abs(got.mean() - 3.0) < 0.1
        normal = [value(np.array([v], dtype).tobytes()) for v in (3.0, 2.0)]
        info = task(data_type, 2, normal, result, counter, num=4096)
        got = np.frombuffer(run(acl, info, stream, 4096 * size), dtype).astype(np.float64)
        assert abs(got.mean() - 3.0) < 0.2 and abs(got.std() - 2.0) < 0.2
        assert got.max() - 3.0 > 4.0 or 3.0 - got.min() > 4.0  # tails beyond 2 stddev
        info = task(data_type, 3, normal, result, counter, num=4096)
        got = np.frombuffer(run(acl, info, stream, 4096 * size), dtype).astype(np.float64)
        assert got.min() >= -1.0 and got.max() <= 7.0 and abs(got.mean() - 3.0) < 0.2


def test_dropout_bitmask_keeps_one_minus_the_ratio(acl, buffers):
    stream, result, counter = buffers
    for data_type, dtype in ((codes.ACL_FLOAT, np.float32), (codes.ACL_FLOAT16, np.float16)):
        ratio = [value(np.array([0.25], dtype).tobytes())]
        assert acl.rt.memset(result, 8 * 4096, 0xFF, 8 * 4096) == 0
        info = task(data_type, 0, ratio, result, counter, num=8000 + 3)
        out = run(acl, info, stream, 1002)
        kept = np.unpackbits(np.frombuffer(out[:1001], np.uint8), bitorder="little")[:8003]
        assert 0.72 < kept.mean() < 0.78
        assert out[1001] == 0xFF  # ceil(8003 / 8) bytes written, no more


def test_the_same_seed_and_counter_give_the_same_numbers_and_the_counter_advances(acl, buffers):
    stream, result, counter = buffers
    bounds = [value(struct.pack("<i", 0)), value(struct.pack("<i", 1 << 30))]
    first = run(acl, task(codes.ACL_INT32, 1, bounds, result, counter, seed=42), stream, 4096)
    assert int.from_bytes(get(acl, counter, 16), "little") == 1024 // 4  # blocks used
    second = run(acl, task(codes.ACL_INT32, 1, bounds, result, counter, seed=42), stream, 4096)
    assert second != first  # the stream goes on
    assert acl.rt.memset(counter, 16, 0, 16) == 0
    again = run(acl, task(codes.ACL_INT32, 1, bounds, result, counter, seed=42), stream, 4096)
    assert again == first
    assert acl.rt.memset(counter, 16, 0, 16) == 0
    other = run(acl, task(codes.ACL_INT32, 1, bounds, result, counter, seed=43), stream, 4096)
    assert other != first


def test_parameters_seed_and_count_read_from_device_memory(acl, buffers):
    """is_addr 1: the value lies in device memory, read when the stream gets there."""
    stream, result, counter = buffers
    low, high = put(acl, struct.pack("<f", 0.0)), put(acl, bytes(4))
    seed, num = put(acl, struct.pack("<Q", 9)), put(acl, struct.pack("<Q", 8))
    assert acl.rt.memset(result, 64, 0, 64) == 0
    assert acl.rt.memcpy_async(high, 4, put(acl, struct.pack("<f", 0.5)), 4, 3, stream) == 0
    info = task(
        codes.ACL_FLOAT,
        1,
        [address(low), address(high)],
        result,
        counter,
        address(seed),
        address(num),
    )
    got = np.frombuffer(run(acl, info, stream, 64), np.float32)
    assert np.all(got[:8] >= 0.0) and np.all(got[:8] <= 0.5) and len(set(got[:8])) == 8
    assert np.all(got[8:] == 0)  # the count was 8
    assert acl.rt.memset(counter, 16, 0, 16) == 0
    same = task(
        codes.ACL_FLOAT,
        1,
        [value(struct.pack("<f", 0.0)), value(struct.pack("<f", 0.5))],
        result,
        counter,
        9,
        8,
    )
    assert run(acl, same, stream, 32) == got[:8].tobytes()
    for ptr in (low, high, seed, num):
        acl.rt.free(ptr)


def test_random_bad_arguments_get_the_runtimes_codes(acl, buffers):
    stream, result, counter = buffers
    good = [value(struct.pack("<f", 0.0)), value(struct.pack("<f", 1.0))]
    base = task(codes.ACL_FLOAT, 1, good, result, counter, num=16)
    f32 = codes.ACL_FLOAT

    def changed(**fields):
        info = task(
            fields.get("data_type", f32),
            fields.get("func_type", 1),
            fields.get("params", good),
            fields.get("result", result),
            fields.get("counter", counter),
            fields.get("seed", 0),
            fields.get("num", 16),
        )
        return info

    invalid, rt_invalid = codes.ACL_ERROR_INVALID_PARAM, codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.random_num_async(None, stream, 0) == invalid
    assert acl.rt.random_num_async(changed(data_type=codes.ACL_DOUBLE), stream, 0) == invalid
    assert acl.rt.random_num_async(changed(data_type=codes.ACL_INT8), stream, 0) == invalid
    assert acl.rt.random_num_async(base, stream, 1) == rt_invalid
    for info in (
        changed(func_type=4),
        changed(func_type=-1),
        changed(func_type=2, data_type=codes.ACL_INT32),
        changed(func_type=0, data_type=codes.ACL_UINT64),
        changed(result=0),
        changed(counter=0),
        changed(params=[value(b""), good[1]]),  # size 0
        changed(params=[good[0], value(bytes(8))]),  # 8 bytes for a float32
        changed(params=[{"is_addr": 2, "value_or_addr": 0, "size": 4}, good[1]]),
        changed(params=[address(0), good[1]]),
        changed(params=[address(0x1234_5678), good[1]]),
        changed(seed={"is_addr": 0, "value_or_addr": 0, "size": 9}),
        changed(num={"is_addr": 0, "value_or_addr": 0, "size": 0}),
        changed(num=8 * 4096),  # past the end of the result's allocation
        changed(counter=counter + 8),  # a counter needs 16 bytes
        changed(result=0x1234_5678),
    ):
        assert acl.rt.random_num_async(info, stream, 0) == rt_invalid, info
    assert acl.rt.random_num_async(base, 0x4444, 0) == codes.ACL_ERROR_RT_INVALID_HANDLE
    with pytest.raises(TypeError):
        acl.rt.random_num_async([1, 2], stream, 0)
    with pytest.raises(TypeError):
        acl.rt.random_num_async({"data_type": "float"}, stream, 0)
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.random_num_async(base, stream, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0


def test_a_count_read_from_memory_past_the_result_fails_the_synchronize(acl, buffers):
    """A count from device memory is known only when the task runs: too many numbers for
    the result's allocation fail the task (507053), and the stream goes on."""
    stream, result, counter = buffers
    num = put(acl, struct.pack("<Q", 1 << 20))
    good = [value(struct.pack("<f", 0.0)), value(struct.pack("<f", 1.0))]
    info = task(codes.ACL_FLOAT, 1, good, result, counter, num=address(num))
    assert acl.rt.random_num_async(info, stream, 0) == 0
    assert acl.rt.synchronize_stream(stream) == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert int.from_bytes(get(acl, counter, 16), "little") == 0  # nothing ran
    assert acl.rt.random_num_async(task(codes.ACL_FLOAT, 1, good, result, counter), stream, 0) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    acl.rt.free(num)
