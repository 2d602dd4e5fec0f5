"""What a rank's HCCL calls ask, checked as HCCL does before anything is matched: the
timeouts of a communicator's init and of a job, the ranks of HcclCommInitRootInfo, the rank
table of HcclCommInitClusterInfo and this daemon's place in it, and a collective or send/recv
with the buffers it reads and writes (a `Call`, server/hccl/collectives.py). Their handlers
are server/control/handlers/hccl_calls.py.

A bad argument is an HcclFailure with its HcclResult, or an NpuError (107000; the handlers
answer a request's with HCCL_E_PARA, and reject a collective's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes, rank_table
from simnpu.proto import hccl_types as ht
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.unit_protocol import Span
from simnpu.server.core.untrusted import RANK_TABLE, quoted
from simnpu.server.hccl.collectives import Call
from simnpu.server.hccl.communicators import HcclFailure

if TYPE_CHECKING:
    from simnpu.proto import commands
    from simnpu.server.core.device import Device
    from simnpu.server.hccl.communicators import Member
    from simnpu.server.memory.client_memory import ClientMemory


# ---- communicators and jobs ---------------------------------------------------------------------
def exec_timeout_s(timeout_ms: int) -> float:
    """A request's HCCL_EXEC_TIMEOUT in seconds (< 0: HCCL's default)."""
    return ht.DEFAULT_EXEC_TIMEOUT_S if timeout_ms < 0 else timeout_ms / 1000.0


def connect_timeout_s(timeout_ms: int) -> float:
    """A request's HCCL_CONNECT_TIMEOUT in seconds (<= 0: HCCL's default)."""
    return timeout_ms / 1000.0 if timeout_ms > 0 else ht.DEFAULT_CONNECT_TIMEOUT_S


def check_ranks(n_ranks: int, rank: int) -> None:
    """HcclCommInitRootInfo: HCCL_E_PARA unless 1 <= n_ranks <= MAX_RANKS, 0 <= rank < n_ranks."""
    if not 1 <= n_ranks <= ht.MAX_RANKS:
        raise HcclFailure(ht.HCCL_E_PARA, f"n_ranks {n_ranks} is not in [1, {ht.MAX_RANKS}]")
    if not 0 <= rank < n_ranks:
        raise HcclFailure(ht.HCCL_E_PARA, f"rank {rank} is not in [0, n_ranks={n_ranks})")


def check_length(text: str, limit: int, what: str) -> str:
    """`text` if it has at most `limit` characters; else HcclFailure(HCCL_E_PARA) naming
    `what` and quoting only its start (server/core/untrusted.py)."""
    if len(text) > limit:
        raise HcclFailure(
            ht.HCCL_E_PARA,
            f"{what} {quoted(text)} is longer than the {limit:,} characters this daemon takes",
        )
    return text


def parse_rank_table(text: str) -> rank_table.RankTable:
    """HcclCommInitClusterInfo's rank table (an HcclFailure if it is longer than RANK_TABLE
    characters or does not parse)."""
    check_length(text, RANK_TABLE, "the rank table")
    try:
        return rank_table.parse(text)
    except rank_table.RankTableError as error:
        raise HcclFailure(error.result, error.message) from None


def cluster_place(
    table: rank_table.RankTable,
    rank: int,
    device: int,
    server_addresses: str,
    advertise: str | None,
) -> tuple[rank_table.TableRank, tuple[str, ...]]:
    """The entry of `rank` on `device` in a completed rank table and, for a table of several
    servers, the daemons' addresses in its servers' order (a world across hosts,
    docs/multihost.md): this daemon (advertising `advertise`) must be the rank's server's."""
    try:
        if not table.completed:
            raise HcclFailure(
                ht.HCCL_E_PARA, f"the rank table's status is {table.status!r}, not 'completed'"
            )
        entry = table.entry(rank, device)
        addresses = table.daemon_addresses(server_addresses) if len(table.servers) > 1 else ()
    except rank_table.RankTableError as error:
        raise HcclFailure(error.result, error.message) from None
    if addresses and addresses[entry.server_index] != advertise:
        raise HcclFailure(
            ht.HCCL_E_PARA,
            f"rank {entry.rank} is on server {entry.server_id!r} of the rank table, whose "
            f"daemon is at {addresses[entry.server_index]}; this daemon "
            + (f"is at {advertise}" if advertise else "advertises no address (--advertise)"),
        )
    return entry, addresses


# ---- collectives --------------------------------------------------------------------------------
def _buffer_bytes(kind: int, size: int, n: int, is_root: bool) -> tuple[int, int]:
    """(bytes the rank's call reads of its send buffer, writes of its recv buffer)."""
    return {
        ht.HCCL_CMD_ALLREDUCE: (size, size),
        ht.HCCL_CMD_REDUCE: (size, size if is_root else 0),
        ht.HCCL_CMD_BROADCAST: (size, 0),
        ht.HCCL_CMD_ALLGATHER: (size, size * n),
        ht.HCCL_CMD_REDUCE_SCATTER: (size * n, size),
        ht.HCCL_CMD_ALLTOALL: (size * n, size * n),
        ht.HCCL_CMD_SCATTER: (size * n if is_root else 0, size),
        ht.HCCL_CMD_SEND: (size, 0),
        ht.HCCL_CMD_RECEIVE: (0, size),
        ht.HCCL_CMD_BARRIER: (0, 0),
    }[kind]


def _buffer(
    memory: ClientMemory, device: Device, member: Member, address: int, nbytes: int, what: str
) -> Span:
    if nbytes == 0:
        return Span(device.region.name, 0, member.device)
    span = memory.device_range(address, nbytes)
    if span.device != member.device:
        raise invalid(
            f"the {what} buffer {address:#x} is on device {span.device} but rank "
            f"{member.rank} of the communicator is on device {member.device}"
        )
    return span


def collective_call(
    record: commands.Collective,
    member: Member,
    stream_device: int,
    memory: ClientMemory,
    device: Device,
) -> Call:
    """One collective or send/recv of rank `member` on a stream of `stream_device`, its
    buffers in `memory` on `device` (the rank's): 107000 for an unknown collective, reduce
    op or rank, a buffer or stream on another device, alltoall counts or types that differ;
    207000 for a data type the simulated NPU does not reduce."""
    if stream_device != member.device:
        raise invalid(
            f"the stream is on device {stream_device} but rank {member.rank} of the "
            f"communicator is on device {member.device}"
        )
    kind, count, dtype, n, rank = (
        record.kind,
        record.count,
        record.dtype,
        member.n_ranks,
        member.rank,
    )
    if kind not in ht.COLLECTIVE_NAMES:
        raise invalid(f"unknown collective {kind}")
    if kind != ht.HCCL_CMD_BARRIER and dtype not in ht.ITEM_SIZES:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"HCCL data type {dtype} is not supported by the simulated NPU",
        )
    if kind in ht.REDUCING and record.op not in ht.REDUCE_OP_NAMES:
        raise invalid(f"unknown reduce op {record.op}")
    if kind in ht.ROOTED + ht.POINT_TO_POINT and not 0 <= record.root < n:
        raise invalid(f"rank {record.root} is not in [0, {n})")
    if kind in ht.POINT_TO_POINT and record.root == rank:
        raise invalid(f"rank {rank} cannot send to or receive from itself")
    if kind == ht.HCCL_CMD_ALLTOALL and (record.recv_count, record.recv_dtype) != (count, dtype):
        raise invalid("alltoall needs recv_count == send_count and recv_type == send_type")
    send_bytes, recv_bytes = _buffer_bytes(
        kind, ht.ITEM_SIZES.get(dtype, 0) * count, n, rank == record.root
    )
    send = _buffer(memory, device, member, record.send, send_bytes, "send")
    recv = _buffer(memory, device, member, record.recv, recv_bytes, "recv")
    return Call(
        kind,
        count,
        dtype,
        record.op,
        record.root,
        send,
        recv,
        record.recv_count,
        record.recv_dtype,
        send_bytes,
        recv_bytes,
    )
