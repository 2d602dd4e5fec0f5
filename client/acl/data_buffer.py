"""aclDataBuffer: a (pointer, size) pair the model and operator calls take.

A data buffer lives in this process only; its handle is an int (0 for none). The C calls
take whatever pointer they are given, so nothing here checks the address.
"""

from __future__ import annotations

import itertools
import threading

from simnpu.client import facade as _api
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

_U32 = 0xFFFFFFFF
_SIZE_MAX = 2**64 - 1
_handles = itertools.count(0x1000, 0x10)
_lock = threading.Lock()
_buffers: dict[int, list[int]] = {}  # handle -> [data, size]


def _int(value, name: str, param: str) -> int:
    if not isinstance(value, int):
        raise TypeError(
            f"{name} args parse failed: {param} must be int, not {type(value).__name__}"
        )
    return int(value)


def create_data_buffer(data, size):
    """aclCreateDataBuffer: the new buffer's handle (not a ret code), 0 if size is out of range."""
    data = _int(data, "acl.create_data_buffer", "data")
    size = _int(size, "acl.create_data_buffer", "size")
    if not 0 <= size <= _SIZE_MAX or not 0 <= data <= _SIZE_MAX:
        _api.failed(
            NpuError(codes.ACL_ERROR_INVALID_PARAM, f"size {size} is out of range"),
            "acl.create_data_buffer",
        )
        return 0
    with _lock:
        handle = next(_handles)
        _buffers[handle] = [data, size]
    return handle


def _buffer(handle: int, name: str) -> list[int]:
    buffer = _buffers.get(handle)
    if buffer is None:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"{handle:#x} is not a data buffer of this process" if handle else "dataBuffer is null",
        )
    return buffer


def destroy_data_buffer(data_buffer):
    """aclDestroyDataBuffer: `ret`; 100000 for null or a buffer already destroyed. The memory
    it points to is the caller's to free."""
    data_buffer = _int(data_buffer, "acl.destroy_data_buffer", "data_buffer")
    with _lock:
        if _buffers.pop(data_buffer, None) is None:
            return _api.failed(
                NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{data_buffer:#x} is not a data buffer"),
                "acl.destroy_data_buffer",
            )
    return codes.ACL_SUCCESS


def update_data_buffer(data_buffer, data, size):
    """aclUpdateDataBuffer: `ret`; point the buffer at other memory (the old is the caller's)."""
    name = "acl.update_data_buffer"
    data_buffer = _int(data_buffer, name, "data_buffer")
    data, size = _int(data, name, "data"), _int(size, name, "size")
    try:
        if not 0 <= size <= _SIZE_MAX or not 0 <= data <= _SIZE_MAX:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"size {size} is out of range")
        with _lock:
            _buffer(data_buffer, name)[:] = [data, size]
    except NpuError as error:
        return _api.failed(error, name)
    return codes.ACL_SUCCESS


def get_data_buffer_addr(data_buffer):
    """aclGetDataBufferAddr: the buffer's address (0 for null or an unknown buffer)."""
    buffer = _buffers.get(_int(data_buffer, "acl.get_data_buffer_addr", "data_buffer"))
    return 0 if buffer is None else buffer[0]


def get_data_buffer_size_v2(data_buffer):
    """aclGetDataBufferSizeV2: the buffer's size (0 for null or an unknown buffer)."""
    buffer = _buffers.get(_int(data_buffer, "acl.get_data_buffer_size_v2", "data_buffer"))
    return 0 if buffer is None else buffer[1]


def get_data_buffer_size(data_buffer):
    """aclGetDataBufferSize (deprecated: use get_data_buffer_size_v2): the size as a uint32."""
    buffer = _buffers.get(_int(data_buffer, "acl.get_data_buffer_size", "data_buffer"))
    return 0 if buffer is None else buffer[1] & _U32
