"""The data movement of a matched HCCL collective, as the daemon plans it for its AI cores.

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
(`split`); each goes to a core as a ReducePiece, which the core runs
(server/units/collective_pieces.py) block by block, so that the running result stays in its
cache. The reduction order is fixed (rank 0, 1, 2, ...) and element-wise, so the result is
the same bit for bit however the work is cut.

In place works: a destination may be one of its own group's sources at the same address
(all_reduce with send == recv; the NCCL in-place layouts of all_gather and
reduce_scatter). Any other overlap of a destination with a source (send == recv in
all_gather or alltoall, say) makes the plan run as one piece that first copies every
source aside (`needs_snapshot`).

Everything here is pure, and runs in the daemon only.
"""

from __future__ import annotations

from simnpu.proto import hccl_types as ht

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
