"""acl.util: pyACL's helpers for pointers, numpy arrays and callback threads.

Pointers are real addresses of this process, as in pyACL: `bytes_to_ptr(b)` is where the
bytes object keeps its data, so it can be the destination of a device-to-host memcpy
(the pyACL samples read the result back with np.frombuffer(b)). Device pointers cannot
be dereferenced here (as on the real host): ptr_to_bytes / ptr_to_numpy refuse them.
"""

from __future__ import annotations

import ctypes
import errno
import sys
import threading
import traceback
import warnings

from simnpu.shm.addresses import DEVICE_BASE


def _address_of(data: bytes) -> int:
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


# CPython keeps a bytes object's data inline, after its header (PyBytesObject.ob_sval);
# checked once against ctypes (None: another layout, ask ctypes every time).
_probe = b"simnpu probe"
_BYTES_DATA: int | None = bytes.__basicsize__ - 1
if _address_of(_probe) != id(_probe) + bytes.__basicsize__ - 1:
    _BYTES_DATA = None


def bytes_to_ptr(data):
    """The address of the data of the bytes object `data` (no copy; keep `data` alive)."""
    if data.__class__ is bytes and _BYTES_DATA is not None:
        return id(data) + _BYTES_DATA
    if not isinstance(data, bytes):
        raise ValueError("acl.util.bytes_to_ptr: needs an byte as argument")  # noqa: TRY004 - as pyACL
    return _address_of(data)


def ptr_to_bytes(ptr, size):
    """A new bytes object holding `size` bytes copied from host address `ptr`."""
    _check_int(ptr, 1, "ptr_to_bytes")
    _check_int(size, 2, "ptr_to_bytes")
    if size <= 0:
        return b""
    if not ptr:
        return bytes(size)  # pyACL: PyBytes_FromStringAndSize(NULL, size)
    _check_host(ptr, "ptr_to_bytes")
    return ctypes.string_at(ptr, size)


def numpy_to_ptr(array):
    """The address of `array`'s data (deprecated in pyACL: use bytes_to_ptr)."""
    import numpy

    warnings.warn(
        "acl.util.numpy_to_ptr will be deprecated. Please use acl.util.bytes_to_ptr instead.",
        Warning,
        stacklevel=2,
    )
    if not isinstance(array, numpy.ndarray):
        raise ValueError("acl.util.numpy_to_ptr: needs an ndarray as argument")  # noqa: TRY004 - as pyACL
    if not array.flags.c_contiguous:
        warnings.warn(
            "The input ndarray is discontiguous. Please use acl.util.bytes_to_ptr instead.",
            Warning,
            stacklevel=2,
        )
    return array.__array_interface__["data"][0]


def numpy_contiguous_to_ptr(array):
    """`ptr, contiguous_array`: the array itself when C-contiguous, else a contiguous copy
    (keep it alive while the pointer is used)."""
    import numpy

    warnings.warn(
        "acl.util.numpy_contiguous_to_ptr will be deprecated. Please use acl.util.bytes_to_ptr "
        "instead.",
        Warning,
        stacklevel=2,
    )
    if not isinstance(array, numpy.ndarray):
        raise ValueError("acl.util.numpy_contiguous_to_ptr: needs an ndarray as argument")  # noqa: TRY004
    contiguous = (
        array
        if array.flags.c_contiguous and array.flags.aligned
        else numpy.ascontiguousarray(array)
    )
    return contiguous.__array_interface__["data"][0], contiguous


def ptr_to_numpy(ptr, shape, npy_type):
    """A writable numpy array viewing host memory at `ptr` (no copy; deprecated in pyACL: use
    ptr_to_bytes). `npy_type` is a numpy type number: 0 bool, 1 int8, 2 uint8, 3 int16,
    4 uint16, 5 int32, 6 uint32, 7/9 int64, 8/10 uint64, 11 float32, 12 float64, 23 float16."""
    import numpy

    warnings.warn(
        "acl.util.ptr_to_numpy will be deprecated. Please use acl.util.ptr_to_bytes instead.",
        Warning,
        stacklevel=2,
    )
    _check_int(ptr, 1, "ptr_to_numpy")
    if not isinstance(shape, (tuple, list)):
        raise ValueError("acl.util.ptr_to_numpy: shape is empty (pass a tuple of ints)")  # noqa: TRY004
    for dim in shape:
        if not isinstance(dim, int):
            raise TypeError("acl.util.ptr_to_numpy: the second argument is not list of int")
    dtype = _numpy_types().get(npy_type)
    if dtype is None:
        raise ValueError(f"acl.util.ptr_to_numpy: unknown numpy type number {npy_type}")
    if not ptr:
        return numpy.empty(shape, dtype)  # pyACL: PyArray_NewFromDescr allocates for NULL
    _check_host(ptr, "ptr_to_numpy")
    count = 1
    for dim in shape:
        count *= dim
    memory = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return numpy.frombuffer(memory, dtype, count).reshape(shape)


_NUMPY_TYPES: dict | None = None


def _numpy_types() -> dict:
    global _NUMPY_TYPES
    if _NUMPY_TYPES is None:
        import numpy

        found: dict = {}
        for code in "?bBhHiIlLqQefdgFDG":
            dtype = numpy.dtype(code)
            found.setdefault(dtype.num, dtype)
        _NUMPY_TYPES = found
    return _NUMPY_TYPES


# ---- threads ---------------------------------------------------------------------------------
_threads: dict[int, tuple[threading.Thread, list]] = {}
_threads_lock = threading.Lock()


def start_thread(function, args):
    """`thread_id, ret`: run function(args) (function() when args is None) on a new thread.
    The id is what subscribe_report takes. The thread has no context: call set_context."""
    if not callable(function):
        raise TypeError("acl.util.start_thread: parameter must be callable")
    failures: list = []
    thread = threading.Thread(
        target=_run, args=(function, args, failures), name="acl.util.thread", daemon=True
    )
    thread.start()
    ident = thread.ident
    assert ident is not None, "a started thread has an ident"
    with _threads_lock:
        _threads[ident] = (thread, failures)
    return ident, 0


def _run(function, args, failures) -> None:
    try:
        function() if args is None else function(args)
    except BaseException as error:  # noqa: BLE001 - pyACL prints it and stop_thread raises it
        traceback.print_exc(file=sys.stderr)
        failures.append(f"exception={type(error).__name__},msg=thread call failed")


def stop_thread(thread_id):
    """Wait for a start_thread thread to return (it must be told to stop first); `ret` (0;
    ESRCH for an unknown id). Raises RuntimeError if the thread's function raised."""
    _check_int(thread_id, 1, "stop_thread")
    with _threads_lock:
        entry = _threads.pop(thread_id, None)
    if entry is None:
        return errno.ESRCH
    thread, failures = entry
    thread.join()
    if failures:
        raise RuntimeError(";".join(failures) + ";")
    return 0


# ---- checks ------------------------------------------------------------------------------------
def _check_int(value, position: int, name: str) -> None:
    if not isinstance(value, int):
        raise TypeError(
            f"acl.util.{name} args parse failed: argument {position} must be int, "
            f"not {type(value).__name__}"
        )


def _check_host(ptr: int, name: str) -> None:
    if ptr >= DEVICE_BASE:
        raise ValueError(
            f"acl.util.{name}: {ptr:#x} is a device pointer, which the host cannot read: "
            "copy it to host memory first (acl.rt.memcpy, ACL_MEMCPY_DEVICE_TO_HOST)"
        )
