"""The raw HCCL layer: one method per HCCL call, arguments checked on the host.

Collectives are packed commands queued on the rank's stream: asynchronous, no reply, a
failure surfaces at the next synchronize with an ACL code (see docs/hccl.md). Root info,
init, destroy and the async-error query are requests. Errors raise HcclError, an NpuError
whose `.code` is an HcclResult. The `hccl` facade and simnpu.client.collectives both
stand on this; one Hccl per Runtime (`of`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from simnpu.client.transport import call_site
from simnpu.proto import commands, rank_table
from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.shm.addresses import is_device_address, split_device_address

if TYPE_CHECKING:
    from simnpu.client.runtime import Runtime
    from simnpu.client.runtime.allocation_index import AllocationIndex
    from simnpu.client.runtime.contexts import Contexts
    from simnpu.client.transport import Connection

RANK_TABLE_WAIT_S = 1800.0  # how long HCCL waits for a rank table to be "completed"
_instances: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_instances_lock = threading.Lock()


class HcclError(NpuError):
    """An HCCL call failed: `.code` is the HcclResult (HCCL_E_PARA, HCCL_E_TIMEOUT, ...)."""

    def __init__(self, code: int, message: str = ""):
        Exception.__init__(self, f"{ht.result_name(code)} ({code}): {message}")
        self.code = int(code)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.code, self.message))


def of(runtime: Runtime) -> Hccl:
    """The Hccl layer of `runtime` (created on first use, with the parts it needs)."""
    with _instances_lock:
        layer = _instances.get(runtime)
        if layer is None:
            layer = Hccl(runtime.connection, runtime.contexts, runtime.allocations)
            _instances[runtime] = layer
        return layer


class CommInfo:
    __slots__ = ("comm_id", "device", "handle", "n_ranks", "rank")

    def __init__(self, handle, n_ranks, rank, device, comm_id):
        self.handle = handle
        self.n_ranks = n_ranks
        self.rank = rank
        self.device = device
        self.comm_id = comm_id

    @property
    def name(self) -> str:
        return f"simnpu-hccl-{self.comm_id}"


def seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise HcclError(ht.HCCL_E_PARA, f"{name}={text!r} is not a number of seconds >= 0")
    return value


class Hccl:
    """The HCCL calls of one session: its connection, the contexts (the current device, the
    streams) and the allocation index (the buffers). Every call that sends is given the call
    site of the public call it serves (`site`; taken here when None)."""

    def __init__(self, connection: Connection, contexts: Contexts, allocations: AllocationIndex):
        self.connection = connection
        self._contexts = contexts
        self._allocations = allocations
        self.comms: dict[int, CommInfo] = {}
        self._lock = threading.Lock()

    def call(self, body: Message, site: str | None = None) -> Any:
        """A request's reply body; its failure as an HcclError (a non-HCCL code: HCCL_E_RUNTIME)."""
        try:
            return self.connection.call(body, site or call_site())
        except NpuError as error:
            if ht.is_result(error.code):
                raise HcclError(error.code, error.message) from None
            raise HcclError(ht.HCCL_E_RUNTIME, str(error)) from None

    def _device(self) -> int:
        try:
            return self._contexts.get_device()
        except NpuError as error:
            raise HcclError(
                ht.HCCL_E_RUNTIME, f"no current device: call set_device first ({error.message})"
            ) from None

    # ---- communicators -----------------------------------------------------------------------
    def get_root_info(self, site: str | None = None) -> bytes:
        """HcclGetRootInfo: a new communicator id for the current device, as 4108 bytes to
        hand every rank. Records this process's HCCL_EXEC_TIMEOUT for the communicator."""
        timeout_s = seconds_from_env(ht.EXEC_TIMEOUT_ENV, ht.DEFAULT_EXEC_TIMEOUT_S)
        reply = self.call(
            pb.HcclGetRootInfoRequest(
                device=self._device(), exec_timeout_ms=round(timeout_s * 1000)
            ),
            site,
        )
        return bytes(reply.root_info)

    def comm_init_root_info(
        self, n_ranks: int, root_info, rank: int, site: str | None = None
    ) -> int:
        """HcclCommInitRootInfo: join as `rank` on the current device. Blocks until every rank
        has joined, or HCCL_CONNECT_TIMEOUT (this process's) has passed (HCCL_E_TIMEOUT)."""
        try:
            data = bytes(root_info)
        except TypeError:
            raise HcclError(
                ht.HCCL_E_PARA, f"root_info must be bytes, not {type(root_info).__name__}"
            ) from None
        if len(data) != ht.HCCL_ROOT_INFO_BYTES:
            raise HcclError(
                ht.HCCL_E_PARA, f"root_info has {len(data)} bytes, not {ht.HCCL_ROOT_INFO_BYTES}"
            )
        n_ranks, rank = int(n_ranks), int(rank)
        if not 0 <= rank < n_ranks:
            raise HcclError(ht.HCCL_E_PARA, f"rank {rank} is not in [0, n_ranks={n_ranks})")
        timeout_s = seconds_from_env(ht.CONNECT_TIMEOUT_ENV, ht.DEFAULT_CONNECT_TIMEOUT_S)
        device = self._device()
        reply = self.call(
            pb.HcclCommInitRequest(
                n_ranks=n_ranks,
                rank=rank,
                device=device,
                root_info=data,
                connect_timeout_ms=round(timeout_s * 1000),
            ),
            site,
        )
        return self._joined(reply, n_ranks, rank, device)

    def comm_init_cluster_info(self, cluster_info, rank: int, site: str | None = None) -> int:
        """HcclCommInitClusterInfo: join as `rank` of the rank table file `cluster_info`
        (proto/rank_table.py) on the current device, which must be the rank's device_id.
        Blocks while the table's status is not "completed" (re-read every second, up to 30
        minutes, as HCCL does: then HCCL_E_TIMEOUT), then until every rank of the table has
        joined, or HCCL_CONNECT_TIMEOUT (this process's) has passed (HCCL_E_TIMEOUT)."""
        if cluster_info is None:
            raise HcclError(ht.HCCL_E_PTR, "cluster_info (the rank table's path) is None")
        if not isinstance(cluster_info, (str, os.PathLike)):
            raise HcclError(
                ht.HCCL_E_PARA,
                f"cluster_info must be a path, not {type(cluster_info).__name__}",
            )
        rank = int(rank)
        device = self._device()
        deadline = time.monotonic() + RANK_TABLE_WAIT_S
        while True:
            table = self._read_rank_table(os.fspath(cluster_info))
            if table.completed:
                break
            if time.monotonic() > deadline:
                raise HcclError(
                    ht.HCCL_E_TIMEOUT,
                    f"{cluster_info}: the rank table's status stayed {table.status!r}, not "
                    f"'completed', for {RANK_TABLE_WAIT_S:g} s",
                )
            time.sleep(1.0)
        try:
            table.entry(rank, device)
        except rank_table.RankTableError as error:
            raise HcclError(error.result, f"{cluster_info}: {error.message}") from None
        connect_s = seconds_from_env(ht.CONNECT_TIMEOUT_ENV, ht.DEFAULT_CONNECT_TIMEOUT_S)
        exec_s = seconds_from_env(ht.EXEC_TIMEOUT_ENV, ht.DEFAULT_EXEC_TIMEOUT_S)
        reply = self.call(
            pb.HcclCommInitClusterRequest(
                rank_table=table.text,
                rank=rank,
                device=device,
                connect_timeout_ms=round(connect_s * 1000),
                exec_timeout_ms=round(exec_s * 1000),
                server_addresses=os.environ.get("SIMNPU_SERVER_ADDRESSES", ""),
            ),
            site,
        )
        return self._joined(reply, len(table.ranks), rank, device)

    @staticmethod
    def _read_rank_table(path: str) -> rank_table.RankTable:
        """The rank table file at `path`: what HCCL fails to load is HCCL_E_INTERNAL."""
        if not path.endswith(".json"):
            raise HcclError(ht.HCCL_E_INTERNAL, f"{path!r}: a rank table's name ends in .json")
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(rank_table.MAX_TABLE_BYTES + 1)
        except (OSError, UnicodeDecodeError) as error:
            raise HcclError(ht.HCCL_E_INTERNAL, f"cannot read the rank table: {error}") from None
        try:
            return rank_table.parse(text)
        except rank_table.RankTableError as error:
            raise HcclError(error.result, f"{path}: {error.message}") from None

    def _joined(self, reply, n_ranks: int, rank: int, device: int) -> int:
        """Record the communicator an init call's `reply` formed; its handle."""
        handle = reply.comm
        with self._lock:
            self.comms[handle] = CommInfo(handle, n_ranks, rank, device, reply.comm_id)
        return handle

    def comm(self, handle: int) -> CommInfo:
        info = self.comms.get(handle)
        if info is None:
            raise HcclError(
                ht.HCCL_E_PARA, f"communicator handle {handle!r} is not valid in this process"
            )
        return info

    def comm_destroy(self, handle: int, site: str | None = None) -> None:
        """HcclCommDestroy: what this rank already queued still runs; the other ranks'
        collectives that it will never join fail (HCCL_E_REMOTE)."""
        self.comm(handle)
        self.call(pb.HcclCommDestroyRequest(comm=handle), site)
        with self._lock:
            self.comms.pop(handle, None)

    def async_error(self, handle: int, site: str | None = None) -> tuple[int, str]:
        """HcclGetCommAsyncError: (HcclResult, message) of the first collective of this rank
        on the communicator that failed; (HCCL_SUCCESS, "") if none."""
        self.comm(handle)
        reply = self.call(pb.HcclCommAsyncErrorRequest(comm=handle), site)
        return reply.result, reply.message

    # ---- collectives -----------------------------------------------------------------------------
    def collective(
        self,
        kind: int,
        comm: int,
        stream: int,
        send: int = 0,
        recv: int = 0,
        count: int = 0,
        dtype: int = ht.HCCL_DATA_TYPE_FP32,
        op: int = ht.HCCL_REDUCE_SUM,
        root: int = 0,
        recv_count: int | None = None,
        recv_dtype: int | None = None,
        site: str | None = None,
    ) -> None:
        """Queue one collective of this rank on `stream` (async). Raises HcclError for what
        the host can see is wrong; the rest fails the task (at synchronize)."""
        info = self.comm(comm)
        n, rank = info.n_ranks, info.rank
        count = int(count)
        recv_count = count if recv_count is None else int(recv_count)
        recv_dtype = dtype if recv_dtype is None else recv_dtype
        if count < 0 or recv_count < 0:
            raise HcclError(ht.HCCL_E_PARA, f"negative count {min(count, recv_count)}")
        if kind != ht.HCCL_CMD_BARRIER:
            for data_type in (dtype, recv_dtype):
                if data_type not in ht.KNOWN_DTYPES:
                    raise HcclError(ht.HCCL_E_PARA, f"unknown HcclDataType {data_type}")
                if data_type not in ht.ITEM_SIZES:
                    raise HcclError(
                        ht.HCCL_E_NOT_SUPPORT,
                        f"HcclDataType {ht.SHORT_DTYPE_NAMES[data_type]} "
                        "is not supported by the simulated NPU",
                    )
        if kind in ht.REDUCING and op not in ht.REDUCE_OP_NAMES:
            raise HcclError(ht.HCCL_E_PARA, f"unknown HcclReduceOp {op}")
        if kind in ht.ROOTED + ht.POINT_TO_POINT and not 0 <= root < n:
            raise HcclError(ht.HCCL_E_PARA, f"rank {root} is not in [0, {n}) of this communicator")
        if kind in ht.POINT_TO_POINT and root == rank:
            raise HcclError(ht.HCCL_E_PARA, f"rank {rank} cannot send to or receive from itself")
        if kind == ht.HCCL_CMD_ALLTOALL and (recv_count, recv_dtype) != (count, dtype):
            raise HcclError(
                ht.HCCL_E_PARA, "alltoall needs recv_count == send_count and recv_type == send_type"
            )
        try:
            record = self._contexts.stream_record(stream)
        except NpuError as error:
            raise HcclError(ht.HCCL_E_PARA, error.message) from None
        stream, stream_device = record.handle, record.context.device
        if stream_device != info.device:
            raise HcclError(
                ht.HCCL_E_PARA,
                f"the stream is on device {stream_device} but rank {rank} of "
                f"the communicator is on device {info.device}",
            )
        itemsize = ht.ITEM_SIZES.get(dtype, 1)
        size = itemsize * count
        send_bytes, recv_bytes = {
            ht.HCCL_CMD_ALLREDUCE: (size, size),
            ht.HCCL_CMD_REDUCE: (size, size if rank == root else 0),
            ht.HCCL_CMD_BROADCAST: (size, 0),
            ht.HCCL_CMD_ALLGATHER: (size, size * n),
            ht.HCCL_CMD_REDUCE_SCATTER: (size * n, size),
            ht.HCCL_CMD_ALLTOALL: (size * n, size * n),
            ht.HCCL_CMD_SCATTER: (size * n if rank == root else 0, size),
            ht.HCCL_CMD_SEND: (size, 0),
            ht.HCCL_CMD_RECEIVE: (0, size),
            ht.HCCL_CMD_BARRIER: (0, 0),
        }[kind]
        self._check_buffer(info, send, send_bytes, itemsize, "send")
        self._check_buffer(info, recv, recv_bytes, itemsize, "recv")
        command = commands.Collective.pack(
            stream,
            comm,
            kind,
            send if send_bytes else 0,
            recv if recv_bytes else 0,
            count,
            recv_count,
            dtype,
            recv_dtype,
            op,
            root,
        )
        self.connection.send_command(command, site or call_site(), stream)

    def _check_buffer(
        self, info: CommInfo, address: int, nbytes: int, itemsize: int, what: str
    ) -> None:
        if nbytes == 0:
            return
        if not address:
            raise HcclError(ht.HCCL_E_PTR, f"the {what} buffer is a null pointer")
        if not is_device_address(address):
            raise HcclError(ht.HCCL_E_PARA, f"the {what} buffer {address:#x} is not device memory")
        device = split_device_address(address)[0]
        if device != info.device:
            raise HcclError(
                ht.HCCL_E_PARA,
                f"the {what} buffer {address:#x} is on device {device} but rank "
                f"{info.rank} of the communicator is on device {info.device}",
            )
        if address % itemsize:
            raise HcclError(
                ht.HCCL_E_PARA,
                f"the {what} buffer {address:#x} is not aligned to its "
                f"element size ({itemsize} bytes)",
            )
        try:
            self._allocations.device_range(address, nbytes)
        except NpuError as error:
            raise HcclError(ht.HCCL_E_PARA, f"the {what} buffer: {error.message}") from None
