"""Device and pinned host buffers that move numpy arrays in and out."""

from __future__ import annotations

import ctypes

import numpy as np

from simnpu.client.device import runtime
from simnpu.client.stream import Stream, current_stream
from simnpu.client.transport import call_site
from simnpu.proto import codes


class DeviceBuffer:
    """aclrtMalloc: `nbytes` of device memory on the current context's device at `ptr` (a
    device address, not dereferenceable on the host; `int(buffer)` gives it), allocated
    with `policy` (`ACL_MEM_MALLOC_*`). free() or the end of `with` releases it. Blocks;
    out of memory raises NpuMemoryError (also a MemoryError)."""

    def __init__(self, nbytes: int, policy: int = codes.ACL_MEM_MALLOC_HUGE_FIRST):
        self.ptr = runtime().memory.malloc(nbytes, policy, site=call_site())
        self.nbytes = nbytes
        self._ipc_key: str | None = None  # set on a buffer imported from another process
        self._exported: list[str] = []

    @classmethod
    def ipc_import(cls, key: str) -> DeviceBuffer:
        """aclrtIpcMemImportByKey: the buffer another process exported under `key`; free()
        closes the import (aclrtIpcMemClose). Blocks."""
        buffer = cls.__new__(cls)
        rt = runtime()
        buffer.ptr = rt.memory.ipc_mem_import_by_key(key, site=call_site())
        buffer.nbytes = rt.allocations.size_of(buffer.ptr)
        buffer._ipc_key, buffer._exported = key, []
        return buffer

    def ipc_export(self, pids=None) -> str:
        """aclrtIpcMemGetExportKey (and aclrtIpcMemSetImportPid): a key other processes can
        import this buffer with; only the given pids (their aclrtDeviceGetBareTgid) may, or
        any process if `pids` is None. free() closes the key before freeing. Blocks."""
        rt = runtime()
        flags = codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION if pids is None else 0
        site = call_site()
        key = rt.memory.ipc_mem_get_export_key(self.ptr, self.nbytes, flags, site=site)
        if pids is not None:
            rt.memory.ipc_mem_set_import_pid(key, list(pids), site=site)
        self._exported.append(key)
        return key

    @classmethod
    def from_array(cls, array, stream: Stream | None = None) -> DeviceBuffer:
        """aclrtMalloc and a host-to-device copy: a new buffer holding a copy of `array`
        (made C-contiguous; at least 1 byte). Blocks; the copy is aclrtMemcpy, or
        aclrtMemcpyAsync on `stream` (see copy_from_host)."""
        array = np.ascontiguousarray(array)
        buffer = cls(max(array.nbytes, 1))
        buffer.copy_from_host(array, stream)
        return buffer

    def __repr__(self) -> str:
        return f"<simnpu DeviceBuffer {self.ptr:#x} {self.nbytes} bytes>"

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __int__(self) -> int:
        return self.ptr

    def free(self) -> None:
        """aclrtFree: the memory goes back to the device at once, without waiting for tasks
        still using it (synchronize first). Asynchronous: it does not wait for the daemon,
        which reports a refusal at the next synchronize. An imported buffer is closed
        instead (aclrtIpcMemClose), and an exporter's keys are closed first, as ACL wants:
        that Blocks. Idempotent."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            memory, site = runtime().memory, call_site()
            if self._ipc_key is not None:
                memory.ipc_mem_close(self._ipc_key, site=site)
                return
            for key in self._exported:
                memory.ipc_mem_close(key, site=site)
            self._exported = []
            memory.free(ptr, site=site)

    def copy_from_host(self, array, stream: Stream | None = None, offset: int = 0) -> None:
        """Host -> device from the C-contiguous `array` into the buffer at `offset`.
        Without `stream`: aclrtMemcpy, Blocks. On `stream`: aclrtMemcpyAsync, in stream
        order; Asynchronous when `array` is pinned memory (a PinnedBuffer's array(): keep it
        unchanged until the stream has run the copy), otherwise it Blocks until the stream
        has run the copy."""
        array = _contiguous(array)
        self._copy(
            self.ptr + offset,
            self.nbytes - offset,
            array.ctypes.data,
            array.nbytes,
            codes.ACL_MEMCPY_HOST_TO_DEVICE,
            stream,
        )

    def copy_to_host(
        self, out: np.ndarray, stream: Stream | None = None, offset: int = 0
    ) -> np.ndarray:
        """Device -> host: `out.nbytes` bytes from the buffer at `offset` into `out` (a
        writeable C-contiguous array: ValueError otherwise); returns `out`. Without `stream`:
        aclrtMemcpy, Blocks. On `stream`: aclrtMemcpyAsync, in stream order; Asynchronous
        when `out` is pinned memory (read it after synchronizing), otherwise it Blocks until
        the stream has run the copy."""
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be a writeable C-contiguous array")
        self._copy(
            out.ctypes.data,
            out.nbytes,
            self.ptr + offset,
            out.nbytes,
            codes.ACL_MEMCPY_DEVICE_TO_HOST,
            stream,
        )
        return out

    def to_numpy(self, dtype=np.uint8, shape=None) -> np.ndarray:
        """A new host array with the buffer's contents: `dtype` elements (without one, a
        uint8 array of `nbytes` bytes), `shape` by default as many whole elements as the
        buffer holds. aclrtMemcpy, not ordered with any stream: synchronize first. Blocks."""
        dtype = np.dtype(dtype)
        shape = (self.nbytes // dtype.itemsize,) if shape is None else shape
        return self.copy_to_host(np.empty(shape, dtype))

    def copy_from(
        self, source: DeviceBuffer, nbytes: int | None = None, stream: Stream | None = None
    ) -> None:
        """Device -> device: `nbytes` (default: all of `source`) from `source` into this
        buffer. Without `stream`: aclrtMemcpy, Blocks. On `stream`: aclrtMemcpyAsync,
        Asynchronous."""
        nbytes = source.nbytes if nbytes is None else nbytes
        self._copy(
            self.ptr, self.nbytes, source.ptr, nbytes, codes.ACL_MEMCPY_DEVICE_TO_DEVICE, stream
        )

    def fill(self, value: int, nbytes: int | None = None, stream: Stream | None = None) -> None:
        """Set the first `nbytes` bytes (default: all) to `value` (its low byte). Without
        `stream`: aclrtMemset, Blocks. On `stream`: aclrtMemsetAsync, Asynchronous."""
        nbytes = self.nbytes if nbytes is None else nbytes
        memory, site = runtime().memory, call_site()
        if stream is None:
            memory.memset(self.ptr, self.nbytes, value, nbytes, site=site)
        else:
            memory.memset_async(self.ptr, self.nbytes, value, nbytes, stream.handle, site=site)

    @staticmethod
    def _copy(dst, dest_max, src, count, kind, stream) -> None:
        memory, site = runtime().memory, call_site()
        if stream is None:
            memory.memcpy(dst, dest_max, src, count, kind, site=site)
        else:
            memory.memcpy_async(dst, dest_max, src, count, kind, stream.handle, site=site)


class PinnedBuffer:
    """aclrtMallocHost: `nbytes` of page-locked host memory at `ptr` (a real address of
    this process). Copies between it and device memory on a stream are truly asynchronous.
    free() or the end of `with` releases it. Blocks."""

    def __init__(self, nbytes: int):
        self.ptr = runtime().host.malloc_host(nbytes, site=call_site())
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"<simnpu PinnedBuffer {self.ptr:#x} {self.nbytes} bytes>"

    def __enter__(self) -> PinnedBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def array(self, dtype=np.uint8, shape=None) -> np.ndarray:
        """A numpy view of the memory: `dtype` elements (default uint8), `shape` by default
        as many whole elements as fit. Drop it before free(). No ACL call. Local."""
        dtype = np.dtype(dtype)
        count = self.nbytes // dtype.itemsize
        memory = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        # a ctypes array exports the buffer protocol; numpy's stubs list only some buffer types
        view = np.frombuffer(memory, dtype, count)  # type: ignore[call-overload]
        return view if shape is None else view.reshape(shape)

    def free(self) -> None:
        """aclrtFreeHost. Blocks. Idempotent."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            runtime().host.free_host(ptr, site=call_site())


def _contiguous(array) -> np.ndarray:
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        raise ValueError("copies need a C-contiguous array (np.ascontiguousarray makes one)")
    return array


__all__ = ["DeviceBuffer", "PinnedBuffer", "current_stream"]
