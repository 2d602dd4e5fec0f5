"""Collectives for new code: a Communicator object over DeviceBuffers and numpy arrays.

    import numpy as np
    import simnpu.client as npu
    from simnpu.client.collectives import Communicator, get_root_info

    npu.Device(rank)                       # one device per rank, or all on 0 (simnpu extension)
    info = get_root_info() if rank == 0 else received_from_rank_0
    with Communicator(n_ranks, info, rank) as comm:          # blocks until all ranks joined
        grads = npu.DeviceBuffer.from_array(local_grads)
        comm.all_reduce(grads, op="sum", dtype=np.float32)    # in place, on the current stream
        npu.current_stream().synchronize()
        total = comm.all_reduce_array(np.ones(4, np.int64))  # host in, host out (blocks)

Buffers are DeviceBuffers (or device pointers as ints); `dtype` is a numpy dtype (or
"bfloat16"), `op` "sum" | "prod" | "max" | "min". Counts default to what the buffers hold.
Collectives are asynchronous on `stream` (default: the current stream); failures raise
NpuError at synchronize, and HcclError (an NpuError with an HcclResult code) at the call
when the host can tell.
"""

from __future__ import annotations

import os

import numpy as np

from simnpu.client import hcclrt
from simnpu.client.buffers import DeviceBuffer
from simnpu.client.device import runtime
from simnpu.client.hcclrt import HcclError
from simnpu.client.stream import Stream, current_stream
from simnpu.client.transport import call_site
from simnpu.proto import hccl_types as ht

__all__ = ["Communicator", "HcclError", "get_root_info", "hccl_dtype"]

_OPS = {
    "sum": ht.HCCL_REDUCE_SUM,
    "prod": ht.HCCL_REDUCE_PROD,
    "max": ht.HCCL_REDUCE_MAX,
    "min": ht.HCCL_REDUCE_MIN,
}
_DTYPES = {name: code for code, name in ht.DTYPE_NAMES.items()}


def hccl_dtype(dtype) -> int:
    """The HcclDataType of a numpy dtype (or of "bfloat16"); an int passes through."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in _DTYPES:
        raise HcclError(ht.HCCL_E_NOT_SUPPORT, f"no HCCL data type for numpy dtype {name!r}")
    return _DTYPES[name]


def numpy_dtype(dtype) -> np.dtype:
    name = ht.DTYPE_NAMES[hccl_dtype(dtype)]
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def get_root_info() -> bytes:
    """HcclGetRootInfo for the current device: the bytes every rank passes to Communicator.
    This process's HCCL_EXEC_TIMEOUT (seconds, default 1836) becomes the communicator's."""
    return _layer().get_root_info(site=call_site())


def _layer() -> hcclrt.Hccl:
    return hcclrt.of(runtime())


def _ptr(buffer) -> int:
    return 0 if buffer is None else int(buffer.ptr if hasattr(buffer, "ptr") else buffer)


def _nbytes(buffer) -> int | None:
    return getattr(buffer, "nbytes", None)


class Communicator:
    """This process's rank of an HCCL communicator (HcclCommInitRootInfo); blocks until all
    `n_ranks` ranks have joined. `with` destroys it at the end (HcclCommDestroy)."""

    def __init__(self, n_ranks: int, root_info: bytes, rank: int):
        layer = _layer()
        self._adopt(layer, layer.comm_init_root_info(n_ranks, root_info, rank, site=call_site()))

    @classmethod
    def from_rank_table(cls, path: str | os.PathLike, rank: int) -> Communicator:
        """HcclCommInitClusterInfo: this process's `rank` of the world the rank table file
        at `path` names (docs/hccl.md), on the current device; blocks until every rank of
        the table has joined."""
        comm = cls.__new__(cls)
        layer = _layer()
        comm._adopt(layer, layer.comm_init_cluster_info(path, rank, site=call_site()))
        return comm

    def _adopt(self, layer, handle: int) -> None:
        self._layer, self.handle = layer, handle
        info = layer.comm(handle)
        self.rank, self.size, self.device, self.name = (
            info.rank,
            info.n_ranks,
            info.device,
            info.name,
        )

    def __repr__(self) -> str:
        return (
            f"<simnpu Communicator {self.name} rank {self.rank}/{self.size} device {self.device}>"
        )

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def destroy(self) -> None:
        """HcclCommDestroy. Idempotent."""
        if self.handle:
            handle, self.handle = self.handle, 0
            self._layer.comm_destroy(handle, site=call_site())

    def async_error(self) -> HcclError | None:
        """HcclGetCommAsyncError: the first failure of this rank's collectives, or None."""
        code, message = self._layer.async_error(self.handle, site=call_site())
        return HcclError(code, message) if code else None

    # ---- asynchronous collectives on device buffers ---------------------------------------------
    def _run(
        self, kind, stream, send, recv, count, dtype, op="sum", root=0, counted=None, per_peer=False
    ):
        """Queue one collective; a missing count is what `counted` holds (per peer: / size)."""
        code = hccl_dtype(dtype)
        if count is None:
            nbytes = _nbytes(counted)
            if nbytes is None:
                raise HcclError(ht.HCCL_E_PARA, "count is needed when buffers are plain pointers")
            count = nbytes // ht.ITEM_SIZES.get(code, 1) // (self.size if per_peer else 1)
        op_code = _OPS[op] if isinstance(op, str) else int(op)
        stream = current_stream() if stream is None else stream
        self._layer.collective(
            kind,
            self.handle,
            stream.handle if isinstance(stream, Stream) else int(stream),
            send=_ptr(send),
            recv=_ptr(recv),
            count=count,
            dtype=code,
            op=op_code,
            root=root,
            site=call_site(),
        )

    def all_reduce(
        self, send, recv=None, op="sum", *, dtype=np.float32, count=None, stream=None
    ) -> None:
        """HcclAllReduce (async); recv=None reduces in place."""
        recv = send if recv is None else recv
        self._run(ht.HCCL_CMD_ALLREDUCE, stream, send, recv, count, dtype, op, counted=send)

    def reduce(
        self, send, recv=None, op="sum", root=0, *, dtype=np.float32, count=None, stream=None
    ) -> None:
        """HcclReduce (async): the result in the root's recv (recv=None: in place)."""
        recv = send if recv is None else recv
        self._run(ht.HCCL_CMD_REDUCE, stream, send, recv, count, dtype, op, root, counted=send)

    def broadcast(self, buffer, root=0, *, dtype=np.float32, count=None, stream=None) -> None:
        """HcclBroadcast (async): the root's buffer to every rank's."""
        self._run(
            ht.HCCL_CMD_BROADCAST, stream, buffer, None, count, dtype, root=root, counted=buffer
        )

    def all_gather(self, send, recv, *, dtype=np.float32, count=None, stream=None) -> None:
        """HcclAllGather (async): recv = every rank's send, in rank order. count = per rank."""
        self._run(ht.HCCL_CMD_ALLGATHER, stream, send, recv, count, dtype, counted=send)

    def reduce_scatter(
        self, send, recv, op="sum", *, dtype=np.float32, count=None, stream=None
    ) -> None:
        """HcclReduceScatter (async): rank r gets block r of the reduction. count = per rank."""
        self._run(ht.HCCL_CMD_REDUCE_SCATTER, stream, send, recv, count, dtype, op, counted=recv)

    def alltoall(self, send, recv, *, dtype=np.float32, count=None, stream=None) -> None:
        """HcclAlltoAll (async): block j of my send goes to rank j. count = per peer."""
        self._run(
            ht.HCCL_CMD_ALLTOALL, stream, send, recv, count, dtype, counted=send, per_peer=True
        )

    def scatter(self, send, recv, root=0, *, dtype=np.float32, count=None, stream=None) -> None:
        """HcclScatter (async): block r of the root's send to rank r's recv. count = per rank."""
        self._run(ht.HCCL_CMD_SCATTER, stream, send, recv, count, dtype, root=root, counted=recv)

    def send(self, buffer, peer: int, *, dtype=np.float32, count=None, stream=None) -> None:
        """HcclSend (async) to `peer`, paired with its recv in issue order."""
        self._run(ht.HCCL_CMD_SEND, stream, buffer, None, count, dtype, root=peer, counted=buffer)

    def recv(self, buffer, peer: int, *, dtype=np.float32, count=None, stream=None) -> None:
        """HcclRecv (async) from `peer`."""
        self._run(
            ht.HCCL_CMD_RECEIVE, stream, None, buffer, count, dtype, root=peer, counted=buffer
        )

    def barrier(self, stream=None) -> None:
        """HcclBarrier (async): the stream goes on once every rank's stream got here."""
        self._run(ht.HCCL_CMD_BARRIER, stream, None, None, 0, np.float32)

    # ---- numpy in, numpy out (synchronous) ---------------------------------------------------
    def _host_call(self, array, method, out_elements=None, **kwargs) -> np.ndarray:
        array = np.ascontiguousarray(array)
        dtype = array.dtype
        stream = Stream()
        send = DeviceBuffer.from_array(array)
        recv = DeviceBuffer(
            max(1, (out_elements if out_elements is not None else array.size) * dtype.itemsize)
        )
        try:
            method(send, recv, dtype=dtype, stream=stream, **kwargs)
            stream.synchronize()
            return recv.to_numpy(dtype)
        finally:
            stream.destroy()
            send.free()
            recv.free()

    def all_reduce_array(self, array, op="sum") -> np.ndarray:
        """all_reduce of a host array: a new array with the reduction over all ranks. Blocks."""
        result = self._host_call(array, lambda s, r, **k: self.all_reduce(s, r, op, **k))
        return result.reshape(np.shape(array))

    def broadcast_array(self, array, root=0) -> np.ndarray:
        """broadcast of a host array (every rank passes one of the same shape). Blocks."""

        def run(send, recv, **kwargs):
            recv.copy_from(send, stream=kwargs["stream"])
            self.broadcast(recv, root, **kwargs)

        return self._host_call(array, run).reshape(np.shape(array))

    def all_gather_array(self, array) -> np.ndarray:
        """all_gather of a host array: shape (n_ranks, *array.shape). Blocks."""
        size = np.asarray(array).size
        result = self._host_call(array, self.all_gather, out_elements=size * self.size)
        return result.reshape((self.size, *np.shape(array)))
