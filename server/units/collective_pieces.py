"""A unit's share of a matched HCCL collective's data movement: a ReducePiece, planned by
the daemon (server/hccl/reduce_plan.py, where a plan's groups are described) and run here,
by the AI cores' workers; and the HCCL data types and reduce operations as numpy's, which
the Gloo exchange process (server/hccl/gloo_exchange_main.py) reduces with too.

A core walks its piece in blocks of REDUCE_BLOCK_BYTES so that the running result stays in
its cache: per block it reads every source once and writes every destination once, with no
temporary of the data's size.
"""

from __future__ import annotations

import time
import traceback

from simnpu.proto import codes
from simnpu.proto import hccl_types as ht
from simnpu.server.core.unit_protocol import REDUCE_BLOCK_BYTES, ReducePiece, Result, Span

_scratch: dict = {}  # dtype -> a block of it, reused by every piece this process runs


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
    """Move the data of `piece` (a list of (group index, first element, end element)) of
    the plan `groups` on `maps`; `snapshot`: copy every source aside first."""
    import numpy as np

    dtype = numpy_dtype(dtype_name)
    block = max(1, REDUCE_BLOCK_BYTES // dtype.itemsize)

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
    copy of REDUCE_BLOCK_BYTES is made with non-temporal stores (server/units/spawning.py),
    which do not first read the destination from memory as a ufunc's stores into it do.
    Otherwise the last step writes straight into the first destination (in place, its lines
    were just read; with two sources the extra pass costs more than the read it saves), and
    the others copy it while it is in cache. A destination may be a source at the same address:
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
