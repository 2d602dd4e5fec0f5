"""`hccl`: HCCL for Python in the pyACL style, on the simulated NPU.

Handles and pointers are ints, the HcclResult comes last (`value, ret` or `ret`), enums and
codes keep their hccl_types.h names and values. Collectives are queued on the stream and
return at once; wait with acl.rt.synchronize_stream(stream), which reports a failed
collective with an ACL code (docs/hccl.md lists them) -- or ask get_comm_async_error.

    import acl, hccl
    acl.rt.set_device(rank)                 # or all ranks on device 0 (a simnpu extension)
    if rank == 0:
        root_info, ret = hccl.get_root_info()   # hand it to every rank out of band
    comm, ret = hccl.comm_init_root_info(n_ranks, root_info, rank)
    ret = hccl.all_reduce(send, recv, count, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM,
                          comm, stream)
    ret = acl.rt.synchronize_stream(stream)
    ret = hccl.comm_destroy(comm)

Messages of failed calls (which ranks never joined, ...) are logged on the "hccl" logger
and kept for get_recent_err_msg() (a simnpu extension, like acl.get_recent_err_msg).
"""

from __future__ import annotations

import logging
import threading

from simnpu.proto import hccl_types as _ht
from simnpu.proto.errors import NpuError as _NpuError

# HCCL_SUCCESS, HCCL_E_*, HCCL_DATA_TYPE_*, HCCL_REDUCE_*, HCCL_CMD_*, HCCL_ROOT_INFO_BYTES, ...
globals().update({name: value for name, value in vars(_ht).items() if name.startswith("HCCL_")})

_log = logging.getLogger("hccl")
_local = threading.local()


def _layer():
    from simnpu.client import device, hcclrt

    return hcclrt.of(device.runtime())


def _failed(error: Exception, name: str) -> int:
    code = (
        error.code
        if isinstance(error, _NpuError) and _ht.is_result(error.code)
        else _ht.HCCL_E_RUNTIME
    )
    message = getattr(error, "message", str(error))
    _local.message = message
    _log.error("%s failed with %s: %s", name, _ht.result_name(code), message)
    return code


def _call(name: str, function, *args, value=None):
    try:
        result = function(*args)
    except _NpuError as error:
        code = _failed(error, name)
        return code if value is None else (value, code)
    return _ht.HCCL_SUCCESS if value is None else (result, _ht.HCCL_SUCCESS)


# ---- communicators ------------------------------------------------------------------------------
def get_root_info():
    """HcclGetRootInfo -> (root_info: bytes of HCCL_ROOT_INFO_BYTES, ret). For the current
    device; this process's HCCL_EXEC_TIMEOUT becomes the communicator's."""
    return _call("get_root_info", lambda: _layer().get_root_info(), value=b"")


def comm_init_root_info(n_ranks: int, root_info: bytes, rank: int):
    """HcclCommInitRootInfo -> (comm, ret). Blocks until all n_ranks ranks have joined;
    HCCL_E_TIMEOUT after HCCL_CONNECT_TIMEOUT seconds (default 120), naming the missing."""
    return _call(
        "comm_init_root_info",
        lambda: _layer().comm_init_root_info(n_ranks, root_info, rank),
        value=0,
    )


def get_rank_size(comm: int):
    """HcclGetRankSize -> (n_ranks, ret)."""
    return _call("get_rank_size", lambda: _layer().comm(comm).n_ranks, value=0)


def get_rank_id(comm: int):
    """HcclGetRankId -> (rank, ret)."""
    return _call("get_rank_id", lambda: _layer().comm(comm).rank, value=0)


def get_comm_name(comm: int):
    """HcclGetCommName -> (name, ret)."""
    return _call("get_comm_name", lambda: _layer().comm(comm).name, value="")


def comm_destroy(comm: int) -> int:
    """HcclCommDestroy -> ret."""
    return _call("comm_destroy", lambda: _layer().comm_destroy(comm))


def get_comm_async_error(comm: int):
    """HcclGetCommAsyncError -> (error, ret): the HcclResult of this rank's first failed
    collective on the communicator (HCCL_E_TIMEOUT, HCCL_E_PARA, HCCL_E_REMOTE, ...)."""

    def query():
        error, message = _layer().async_error(comm)
        if error:
            _local.message = message
        return error

    return _call("get_comm_async_error", query, value=_ht.HCCL_SUCCESS)


def get_error_string(code: int) -> str:
    """HcclGetErrorString."""
    return _ht.describe_result(code)


def get_recent_err_msg() -> str | None:
    """The message of this thread's latest failed hccl call, cleared (a simnpu extension)."""
    message = getattr(_local, "message", None)
    _local.message = None
    return message


def rendezvous(job: str, world_size: int):
    """(simnpu extension) -> (rank, root_info, ret): blocks until `world_size` processes of
    `job` have called it; ranks 0..world_size-1 in arrival order, one root info for all, to
    pass to comm_init_root_info. For identical replicas that know neither (docs/hccl.md)."""
    from simnpu.client.rendezvous import rendezvous as join

    try:
        joined = join(job, world_size)
    except _NpuError as error:
        return 0, b"", _failed(error, "rendezvous")
    return joined.rank, joined.root_info, _ht.HCCL_SUCCESS


# ---- collectives (asynchronous: ret says whether it was queued) ---------------------------------
def _collective(name, kind, comm, stream, **fields) -> int:
    return _call(name, lambda: _layer().collective(kind, comm, stream, **fields))


def all_reduce(
    send: int, recv: int, count: int, data_type: int, op: int, comm: int, stream: int
) -> int:
    """HcclAllReduce."""
    return _collective(
        "all_reduce",
        _ht.HCCL_CMD_ALLREDUCE,
        comm,
        stream,
        send=send,
        recv=recv,
        count=count,
        dtype=data_type,
        op=op,
    )


def broadcast(buf: int, count: int, data_type: int, root: int, comm: int, stream: int) -> int:
    """HcclBroadcast (in place: the root's buf to every rank's buf)."""
    return _collective(
        "broadcast",
        _ht.HCCL_CMD_BROADCAST,
        comm,
        stream,
        send=buf,
        count=count,
        dtype=data_type,
        root=root,
    )


def all_gather(
    send: int, recv: int, send_count: int, data_type: int, comm: int, stream: int
) -> int:
    """HcclAllGather: recv holds send_count x n_ranks elements, rank order."""
    return _collective(
        "all_gather",
        _ht.HCCL_CMD_ALLGATHER,
        comm,
        stream,
        send=send,
        recv=recv,
        count=send_count,
        dtype=data_type,
    )


def reduce_scatter(
    send: int, recv: int, recv_count: int, data_type: int, op: int, comm: int, stream: int
) -> int:
    """HcclReduceScatter: send holds recv_count x n_ranks elements."""
    return _collective(
        "reduce_scatter",
        _ht.HCCL_CMD_REDUCE_SCATTER,
        comm,
        stream,
        send=send,
        recv=recv,
        count=recv_count,
        dtype=data_type,
        op=op,
    )


def reduce(
    send: int, recv: int, count: int, data_type: int, op: int, root: int, comm: int, stream: int
) -> int:
    """HcclReduce: the result lands in the root's recv."""
    return _collective(
        "reduce",
        _ht.HCCL_CMD_REDUCE,
        comm,
        stream,
        send=send,
        recv=recv,
        count=count,
        dtype=data_type,
        op=op,
        root=root,
    )


def scatter(
    send: int, recv: int, recv_count: int, data_type: int, root: int, comm: int, stream: int
) -> int:
    """HcclScatter: block r of the root's send to rank r's recv."""
    return _collective(
        "scatter",
        _ht.HCCL_CMD_SCATTER,
        comm,
        stream,
        send=send,
        recv=recv,
        count=recv_count,
        dtype=data_type,
        root=root,
    )


def alltoall(
    send: int,
    send_count: int,
    send_type: int,
    recv: int,
    recv_count: int,
    recv_type: int,
    comm: int,
    stream: int,
) -> int:
    """HcclAlltoAll: block j of rank i's send lands in block i of rank j's recv."""
    return _collective(
        "alltoall",
        _ht.HCCL_CMD_ALLTOALL,
        comm,
        stream,
        send=send,
        recv=recv,
        count=send_count,
        dtype=send_type,
        recv_count=recv_count,
        recv_dtype=recv_type,
    )


def send(buf: int, count: int, data_type: int, dest_rank: int, comm: int, stream: int) -> int:
    """HcclSend: pairs with dest_rank's recv (the j-th send to it with its j-th recv)."""
    return _collective(
        "send",
        _ht.HCCL_CMD_SEND,
        comm,
        stream,
        send=buf,
        count=count,
        dtype=data_type,
        root=dest_rank,
    )


def recv(buf: int, count: int, data_type: int, src_rank: int, comm: int, stream: int) -> int:
    """HcclRecv."""
    return _collective(
        "recv",
        _ht.HCCL_CMD_RECEIVE,
        comm,
        stream,
        recv=buf,
        count=count,
        dtype=data_type,
        root=src_rank,
    )


def barrier(comm: int, stream: int) -> int:
    """HcclBarrier: every rank's stream waits here until all ranks' streams have reached it."""
    return _collective("barrier", _ht.HCCL_CMD_BARRIER, comm, stream)
