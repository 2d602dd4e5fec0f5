"""The data movement of a matched HCCL collective: planned in the daemon, run by AI cores.

A plan is a list of groups. A group reduces its sources element-wise in rank order and
writes the result to each of its destinations (a group with one source copies it):

  all_reduce      1 group: every rank's send -> every rank's recv
  reduce          1 group: every rank's send -> the root's recv
  broadcast       1 group: the root's buffer -> every other rank's buffer
  reduce_scatter  n groups: block r of every rank's send -> rank r's recv
  all_gather      n groups: rank i's send -> block i of every rank's recv
  alltoall        n*n groups: block j of rank i's send -> block i of rank j's recv
  scatter         n groups: block r of the root's send -> rank r's recv
  send/recv       1 group: the sender's buffer -> the receiver's

The element ranges of all groups are cut into pieces, one per AI core taking part
(`split`); a core walks its piece in blocks of BLOCK_BYTES so that the running result
stays in its cache: per block it reads every source once and writes every destination
once, with no temporary of the data's size. The reduction order is fixed (rank 0, 1,
2, ...) and element-wise, so the result is the same bit for bit however the work is cut.

In place works: a destination may be one of its own group's sources at the same address
(all_reduce with send == recv; the NCCL in-place layouts of all_gather and
reduce_scatter). Any other overlap of a destination with a source (send == recv in
all_gather or alltoall, say) makes the plan run as one piece that first copies every
source aside (`needs_snapshot`).

The daemon side (plan, needs_snapshot, split) is pure; `execute` runs in a worker.
"""

from __future__ import annotations

import time
import traceback

from simnpu.proto import codes
from simnpu.proto import hccl_types as ht
from simnpu.server.core.unit_protocol import ReducePiece, Result, Span

# of each source per step: the running result stays in L2, and the workers copy blocks
# this large with non-temporal stores (server/units/workers.py), so that writing a destination
# does not first read it (512 KiB against 1 MiB: reduce_scatter of 64 MiB over 4 ranks
# +6 % out of place and +15 % in place, nothing slower;
# docs/decisions/collective-blocks-of-512-kib.md)
BLOCK_BYTES = 1 << 19
MIN_PIECE_BYTES = 2 << 20  # a piece is worth a message and a wake-up above this
PIECES_PER_CORE = 2  # a core that finishes early (or starts late) takes more of the pieces

Group = tuple  # (sources, destinations, element count); sources and destinations are Spans


def plan(kind: int, sends: list, recvs: list, count: int, root: int, itemsize: int) -> list:
    """The groups of a collective over n ranks: sends[r] / recvs[r] are rank r's buffers.

    `count` is what the rank-level call calls it: per rank (all_reduce, reduce,
    broadcast, send), sendCount (all_gather), recvCount (reduce_scatter, scatter), the
    count per peer (alltoall). Broadcast passes each rank's buffer as its send.
    """
    n = len(sends)
    step = count * itemsize
    if count == 0 or kind == ht.HCCL_CMD_BARRIER:
        return []
    if kind == ht.HCCL_CMD_ALLREDUCE:
        groups = [(tuple(sends), tuple(recvs), count)]
    elif kind == ht.HCCL_CMD_REDUCE:
        groups = [(tuple(sends), (recvs[root],), count)]
    elif kind == ht.HCCL_CMD_BROADCAST:
        groups = [((sends[root],), tuple(sends), count)]
    elif kind == ht.HCCL_CMD_REDUCE_SCATTER:
        groups = [(tuple(s.at(r * step) for s in sends), (recvs[r],), count) for r in range(n)]
    elif kind == ht.HCCL_CMD_ALLGATHER:
        groups = [
            ((sends[i],), tuple(recvs[r].at(i * step) for r in range(n)), count) for i in range(n)
        ]
    elif kind == ht.HCCL_CMD_ALLTOALL:
        groups = [
            ((sends[i].at(j * step),), (recvs[j].at(i * step),), count)
            for i in range(n)
            for j in range(n)
        ]
    elif kind == ht.HCCL_CMD_SCATTER:
        groups = [((sends[root].at(r * step),), (recvs[r],), count) for r in range(n)]
    elif kind in ht.POINT_TO_POINT:  # sends = [the sender's buffer], recvs = [the receiver's]
        groups = [((sends[0],), (recvs[0],), count)]
    else:
        raise ValueError(f"no plan for collective {kind}")
    planned = []
    for sources, destinations, elements in groups:
        if len(sources) == 1:  # a copy onto itself is no work
            destinations = tuple(d for d in destinations if d != sources[0])
        if destinations:
            planned.append((sources, destinations, elements))
    return planned


def needs_snapshot(groups: list, itemsize: int) -> bool:
    """True when some destination overlaps a source other than itself in its own group,
    so that writing it could change what another part of the plan still has to read."""
    sources = [
        (g, span.segment, span.offset, span.offset + count * itemsize)
        for g, (srcs, _, count) in enumerate(groups)
        for span in srcs
    ]
    for g, (_, dsts, count) in enumerate(groups):
        for span in dsts:
            segment, offset = span.segment, span.offset
            end = offset + count * itemsize
            for h, s_segment, s_start, s_end in sources:
                if s_segment == segment and s_start < end and offset < s_end:
                    if h == g and s_start == offset:
                        continue
                    return True
    return False


def piece_count(bytes_moved: int, cores: int) -> int:
    """How many pieces to cut a plan into: a few per core, handed out as cores become free
    (so a core slowed down by other work does less of it), but none smaller than
    MIN_PIECE_BYTES of data written (below that a piece costs more than it saves)."""
    return max(1, min(cores * PIECES_PER_CORE, bytes_moved // MIN_PIECE_BYTES))


def bytes_written(groups: list, itemsize: int) -> int:
    return sum(len(dsts) * count for _, dsts, count in groups) * itemsize


def split(groups: list, pieces: int) -> list:
    """Cut the concatenated element ranges of `groups` into `pieces` nearly equal runs:
    a list of pieces, each a list of (group index, first element, end element)."""
    total = sum(count for _, _, count in groups)
    pieces = max(1, min(pieces, total))
    bounds = [total * i // pieces for i in range(pieces + 1)]
    result: list = []
    group, base = 0, 0  # the group holding element `bounds[i]`, and where that group starts
    for i in range(pieces):
        start, stop = bounds[i], bounds[i + 1]
        piece = []
        while start < stop:
            count = groups[group][2]
            if start >= base + count:
                base += count
                group += 1
                continue
            end = min(stop, base + count)
            piece.append((group, start - base, end - base))
            start = end
        result.append(piece)
    return result


# ---- worker side -----------------------------------------------------------------------------
_scratch: dict = {}


def numpy_dtype(name: str):
    """The numpy dtype of an HCCL data type's name (hccl_types.DTYPE_NAMES), bfloat16 included."""
    import numpy as np

    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def reduce_ufunc(op: int):
    """The numpy ufunc of an HcclReduceOp."""
    import numpy as np

    return {
        ht.HCCL_REDUCE_SUM: np.add,
        ht.HCCL_REDUCE_PROD: np.multiply,
        ht.HCCL_REDUCE_MAX: np.maximum,
        ht.HCCL_REDUCE_MIN: np.minimum,
    }[op]


def execute(maps: dict, item: ReducePiece) -> Result:
    """Run one share of a collective's data movement on the unit's device mappings (by
    segment name)."""
    token = item.token
    start = time.monotonic_ns()
    try:
        run(maps, item.dtype, item.op, item.groups, item.snapshot, item.piece)
    except BaseException as exc:
        return Result(
            token,
            codes.ACL_ERROR_RT_AICORE_EXCEPTION,
            start,
            time.monotonic_ns(),
            "collective data movement failed:\n" + "".join(traceback.format_exception(exc)),
        )
    return Result(token, 0, start, time.monotonic_ns(), "")


def run(maps: dict, dtype_name: str, op: int, groups: list, snapshot: bool, piece: list) -> None:
    import numpy as np

    dtype = numpy_dtype(dtype_name)
    block = max(1, BLOCK_BYTES // dtype.itemsize)

    def view(span: Span, first: int, count: int):
        return np.frombuffer(maps[span.segment], dtype, count, span.offset + first * dtype.itemsize)

    work = []
    for g, first, end in piece:
        sources, destinations, _ = groups[g]
        count = end - first
        srcs = [view(s, first, count) for s in sources]
        work.append((srcs, [view(d, first, count) for d in destinations]))
    if snapshot:  # every source copied aside before anything is written
        work = [([s.copy() for s in srcs], dsts) for srcs, dsts in work]
    ufunc = reduce_ufunc(op) if any(len(srcs) > 1 for srcs, _ in work) else None
    with np.errstate(all="ignore"):  # overflow is the data's business, as on the device
        for srcs, dsts in work:
            if len(srcs) == 1:
                _copy_out(srcs[0], dsts, block)
            else:
                _reduce_out(ufunc, srcs, dsts, block, dtype)


def _copy_out(src, dsts, block) -> None:
    import numpy as np

    if len(dsts) == 1:
        np.copyto(dsts[0], src)
        return
    for first in range(0, len(src), block):  # each block of the source is read once
        end = first + block
        part = src[first:end]
        for dst in dsts:
            np.copyto(dst[first:end], part)


def _reduce_out(ufunc, srcs, dsts, block, dtype) -> None:
    """dsts[*] = srcs[0] op srcs[1] op ... in rank order, block by block.

    With three sources or more and a first destination that is none of them, each block is
    reduced into a scratch block that stays in cache and copied to every destination: a
    copy of BLOCK_BYTES is made with non-temporal stores (server/units/workers.py), which do not
    first read the destination from memory as a ufunc's stores into it do. Otherwise the
    last step writes straight into the first destination (in place, its lines were just
    read; with two sources the extra pass costs more than the read it saves), and the
    others copy it while it is in cache. A destination may be a source at the same address:
    each block reads all its sources before any destination of it is written.
    """
    import numpy as np

    acc = _scratch.get(dtype)
    if acc is None or len(acc) < block:
        acc = _scratch[dtype] = np.empty(block, dtype)
    first_dst = dsts[0]
    stream_out = len(srcs) > 2 and not any(np.may_share_memory(first_dst, s) for s in srcs)
    last = len(srcs) - 1
    for first in range(0, len(srcs[0]), block):
        end = first + block
        out = first_dst[first:end]
        if last == 1:
            ufunc(srcs[0][first:end], srcs[1][first:end], out=out)
        else:
            running = acc[: len(out)]
            ufunc(srcs[0][first:end], srcs[1][first:end], out=running)
            for src in srcs[2:last]:
                ufunc(running, src[first:end], out=running)
            ufunc(running, srcs[last][first:end], out=running if stream_out else out)
            if stream_out:
                np.copyto(out, running)
        for dst in dsts[1:]:
            np.copyto(dst[first:end], running if stream_out else out)
