"""acl.util: pointers are real addresses of this process, as in pyACL."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest


def test_bytes_to_ptr_is_the_bytes_data_and_a_memcpy_destination(acl):
    """The pyACL sample pattern: bytes_to_ptr -> memcpy D2H into it -> read the bytes."""
    data = bytes(range(256)) * 64
    assert ctypes.string_at(acl.util.bytes_to_ptr(data), 16) == data[:16]
    dev, _ = acl.rt.malloc(len(data), 0)
    assert (
        acl.rt.memcpy(
            dev, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
        )
        == 0
    )
    back = bytes(len(data))
    assert (
        acl.rt.memcpy(
            acl.util.bytes_to_ptr(back), len(back), dev, len(data), acl.ACL_MEMCPY_DEVICE_TO_HOST
        )
        == 0
    )
    assert back == data  # written in place, as pyACL programs expect
    assert np.array_equal(np.frombuffer(back, np.uint8), np.frombuffer(data, np.uint8))
    assert acl.util.ptr_to_bytes(acl.util.bytes_to_ptr(back), 100) == data[:100]
    assert acl.rt.free(dev) == 0


def test_pinned_memory_round_trip_through_util(acl):
    pinned, _ = acl.rt.malloc_host(1024)
    source = np.arange(256, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        view = acl.util.ptr_to_numpy(pinned, (16, 16), 11)  # NPY_FLOAT32, no copy
        assert view.dtype == np.float32 and view.shape == (16, 16)
        view[:] = source.reshape(16, 16)
        assert acl.util.ptr_to_bytes(pinned, 1024) == source.tobytes()
        assert acl.util.ptr_to_numpy(pinned, (4,), 23).dtype == np.float16
        assert acl.util.ptr_to_numpy(0, (3,), 5).shape == (3,)  # NULL: new memory, as pyACL
    del view
    assert acl.rt.free_host(pinned) == 0


def test_numpy_helpers_warn_and_return_data_pointers(acl):
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    with pytest.warns(Warning, match="deprecated"):
        assert acl.util.numpy_to_ptr(array) == array.ctypes.data
    strided = array[:, ::2]
    with pytest.warns(Warning):
        ptr, contiguous = acl.util.numpy_contiguous_to_ptr(strided)
    assert contiguous.flags.c_contiguous and ptr == contiguous.ctypes.data
    assert np.array_equal(contiguous, strided)
    with pytest.warns(Warning):
        ptr, same = acl.util.numpy_contiguous_to_ptr(array)
    assert same is array and ptr == array.ctypes.data


def test_util_argument_errors(acl):
    with pytest.raises(ValueError):
        acl.util.bytes_to_ptr(bytearray(4))
    with pytest.raises(ValueError):
        acl.util.bytes_to_ptr("text")
    dev, _ = acl.rt.malloc(64, 0)
    with pytest.raises(ValueError, match="device pointer"):
        acl.util.ptr_to_bytes(dev, 8)
    with pytest.raises(TypeError):
        acl.util.ptr_to_bytes(1.0, 8)
    assert acl.util.ptr_to_bytes(0, 4) == bytes(4)
    assert acl.util.ptr_to_bytes(dev, 0) == b""
    with pytest.warns(Warning), pytest.raises(ValueError):
        acl.util.numpy_to_ptr([1, 2, 3])
    assert acl.rt.free(dev) == 0
