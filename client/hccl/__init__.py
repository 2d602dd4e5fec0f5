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
and kept as the thread's last error (get_recent_err_msg(), a simnpu extension, like
acl.get_recent_err_msg). Every call is made by the same facade helper as acl's
(client/facade.py).
"""

from __future__ import annotations

import logging

from simnpu.client import facade as _facade
from simnpu.client import last_error as _last_error
from simnpu.proto import hccl_types as _ht
from simnpu.proto.errors import NpuError as _NpuError

# HCCL_SUCCESS, HCCL_E_*, HCCL_DATA_TYPE_*, HCCL_REDUCE_*, HCCL_CMD_*, HCCL_ROOT_INFO_BYTES, ...
globals().update({name: value for name, value in vars(_ht).items() if name.startswith("HCCL_")})

_log = logging.getLogger("hccl")


def _layer():
    from simnpu.client import device, hcclrt

    return hcclrt.of(device.runtime())


def _failed(error: _NpuError, name: str) -> int:
    """An hccl call failed: its HcclResult (HCCL_E_RUNTIME for an ACL code), logged and kept
    as the thread's last error."""
    code = error.code if _ht.is_result(error.code) else _ht.HCCL_E_RUNTIME
    _log.error("%s failed with %s: %s", name, _ht.result_name(code), error.message)
    return _last_error.keep(code, error.message)


def _hccl(spec: str, outputs: tuple | None = None):
    """An hccl call: `body(rt, *params)` made by the facade helper; `rt` is unused, the body
    reaches the HCCL layer of this process's runtime itself (hcclrt)."""
    return _facade.api(spec, outputs, needs_session=False, failure=_failed, range_checked=False)


# ---- communicators ------------------------------------------------------------------------------
@_hccl("", (b"",))
def get_root_info(rt, *, site):
    """HcclGetRootInfo -> (root_info: bytes of HCCL_ROOT_INFO_BYTES, ret). For the current
    device; this process's HCCL_EXEC_TIMEOUT becomes the communicator's."""
    return _layer().get_root_info(site=site)


@_hccl("OOO", (0,))
def comm_init_root_info(rt, n_ranks, root_info, rank, *, site):
    """HcclCommInitRootInfo -> (comm, ret). Blocks until all n_ranks ranks have joined;
    HCCL_E_TIMEOUT after HCCL_CONNECT_TIMEOUT seconds (default 120), naming the missing."""
    return _layer().comm_init_root_info(n_ranks, root_info, rank, site=site)


@_hccl("OO", (0,))
def comm_init_cluster_info(rt, cluster_info, rank, *, site):
    """HcclCommInitClusterInfo -> (comm, ret): `rank` of the rank table file `cluster_info`
    (version 1.0 JSON, one server), on the current device, which must be the rank's
    device_id. Blocks until every rank of the table has joined (as comm_init_root_info)."""
    return _layer().comm_init_cluster_info(cluster_info, rank, site=site)


@_hccl("O", (0,))
def get_rank_size(rt, comm):
    """HcclGetRankSize -> (n_ranks, ret)."""
    return _layer().comm(comm).n_ranks


@_hccl("O", (0,))
def get_rank_id(rt, comm):
    """HcclGetRankId -> (rank, ret)."""
    return _layer().comm(comm).rank


@_hccl("O", ("",))
def get_comm_name(rt, comm):
    """HcclGetCommName -> (name, ret)."""
    return _layer().comm(comm).name


@_hccl("O")
def comm_destroy(rt, comm, *, site):
    """HcclCommDestroy -> ret."""
    _layer().comm_destroy(comm, site=site)


@_hccl("O", (_ht.HCCL_SUCCESS,))
def get_comm_async_error(rt, comm, *, site):
    """HcclGetCommAsyncError -> (error, ret): the HcclResult of this rank's first failed
    collective on the communicator (HCCL_E_TIMEOUT, HCCL_E_PARA, HCCL_E_REMOTE, ...)."""
    error, message = _layer().async_error(comm, site=site)
    if error:
        _last_error.explain(message)
    return error


def get_error_string(code: int) -> str:
    """HcclGetErrorString."""
    return _ht.describe_result(code)


def get_recent_err_msg() -> str | None:
    """The message of this thread's latest failed hccl call, cleared (a simnpu extension)."""
    return _last_error.message()


@_hccl("OO", (0, b""))
def rendezvous(rt, job, world_size):
    """(simnpu extension) -> (rank, root_info, ret): blocks until `world_size` processes of
    `job` have called it; ranks 0..world_size-1 in arrival order, one root info for all, to
    pass to comm_init_root_info. For identical replicas that know neither (docs/hccl.md)."""
    from simnpu.client.rendezvous import rendezvous as join

    joined = join(job, world_size)
    return joined.rank, joined.root_info


# ---- collectives (asynchronous: ret says whether it was queued) ---------------------------------
@_hccl("OOOOOOO")
def all_reduce(rt, send, recv, count, data_type, op, comm, stream, *, site):
    """HcclAllReduce."""
    _layer().collective(
        _ht.HCCL_CMD_ALLREDUCE,
        comm,
        stream,
        send=send,
        recv=recv,
        count=count,
        dtype=data_type,
        op=op,
        site=site,
    )


@_hccl("OOOOOO")
def broadcast(rt, buf, count, data_type, root, comm, stream, *, site):
    """HcclBroadcast (in place: the root's buf to every rank's buf)."""
    _layer().collective(
        _ht.HCCL_CMD_BROADCAST,
        comm,
        stream,
        send=buf,
        count=count,
        dtype=data_type,
        root=root,
        site=site,
    )


@_hccl("OOOOOO")
def all_gather(rt, send, recv, send_count, data_type, comm, stream, *, site):
    """HcclAllGather: recv holds send_count x n_ranks elements, rank order."""
    _layer().collective(
        _ht.HCCL_CMD_ALLGATHER,
        comm,
        stream,
        send=send,
        recv=recv,
        count=send_count,
        dtype=data_type,
        site=site,
    )


@_hccl("OOOOOOO")
def reduce_scatter(rt, send, recv, recv_count, data_type, op, comm, stream, *, site):
    """HcclReduceScatter: send holds recv_count x n_ranks elements."""
    _layer().collective(
        _ht.HCCL_CMD_REDUCE_SCATTER,
        comm,
        stream,
        send=send,
        recv=recv,
        count=recv_count,
        dtype=data_type,
        op=op,
        site=site,
    )


@_hccl("OOOOOOOO")
def reduce(rt, send, recv, count, data_type, op, root, comm, stream, *, site):
    """HcclReduce: the result lands in the root's recv."""
    _layer().collective(
        _ht.HCCL_CMD_REDUCE,
        comm,
        stream,
        send=send,
        recv=recv,
        count=count,
        dtype=data_type,
        op=op,
        root=root,
        site=site,
    )


@_hccl("OOOOOOO")
def scatter(rt, send, recv, recv_count, data_type, root, comm, stream, *, site):
    """HcclScatter: block r of the root's send to rank r's recv."""
    _layer().collective(
        _ht.HCCL_CMD_SCATTER,
        comm,
        stream,
        send=send,
        recv=recv,
        count=recv_count,
        dtype=data_type,
        root=root,
        site=site,
    )


@_hccl("OOOOOOOO")
def alltoall(rt, send, send_count, send_type, recv, recv_count, recv_type, comm, stream, *, site):
    """HcclAlltoAll: block j of rank i's send lands in block i of rank j's recv."""
    _layer().collective(
        _ht.HCCL_CMD_ALLTOALL,
        comm,
        stream,
        send=send,
        recv=recv,
        count=send_count,
        dtype=send_type,
        recv_count=recv_count,
        recv_dtype=recv_type,
        site=site,
    )


@_hccl("OOOOOO")
def send(rt, buf, count, data_type, dest_rank, comm, stream, *, site):
    """HcclSend: pairs with dest_rank's recv (the j-th send to it with its j-th recv)."""
    _layer().collective(
        _ht.HCCL_CMD_SEND,
        comm,
        stream,
        send=buf,
        count=count,
        dtype=data_type,
        root=dest_rank,
        site=site,
    )


@_hccl("OOOOOO")
def recv(rt, buf, count, data_type, src_rank, comm, stream, *, site):
    """HcclRecv."""
    _layer().collective(
        _ht.HCCL_CMD_RECEIVE,
        comm,
        stream,
        recv=buf,
        count=count,
        dtype=data_type,
        root=src_rank,
        site=site,
    )


@_hccl("OO")
def barrier(rt, comm, stream, *, site):
    """HcclBarrier: every rank's stream waits here until all ranks' streams have reached it."""
    _layer().collective(_ht.HCCL_CMD_BARRIER, comm, stream, site=site)


__getattr__, __dir__ = _facade.on_demand(globals())
