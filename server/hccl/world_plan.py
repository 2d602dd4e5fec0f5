"""The plan of a collective across hosts (docs/multihost.md): pure functions of plain values,
with no daemon, world or process behind them.

A world across hosts runs each matched collective in three phases on every host: the AI
cores reduce or gather the host's own ranks into a *host block* in device memory, the
Gloo exchange processes (server/hccl/gloo_exchange.py) exchange the blocks between hosts
in steps, and the AI cores copy the result out. `plan` lays out one host's share: the
groups of the first and the last phase (server/hccl/reduce_plan.py's form) and the
exchange's steps between, from the world's hosts, the local ranks' calls and where the
host block lies. Every host plans the same steps, in the same order, with the same
sequence numbers; the world (server/hccl/world.py) runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from simnpu.proto import hccl_types as ht
from simnpu.server.core.unit_protocol import Span
from simnpu.server.hccl.gloo_exchange_protocol import Exchange, Gather, Match, Reduce, Step

if TYPE_CHECKING:
    from simnpu.server.hccl.collectives import Call

# a world's hosts in host order, each its daemon's advertised address and its ranks:
# ((address, (rank, ...)), ...)
Hosts = tuple[tuple[str, tuple[int, ...]], ...]


def host_of(hosts: Hosts, rank: int) -> int:
    """The index of the host that serves global rank `rank`."""
    for index, (_, ranks) in enumerate(hosts):
        if rank in ranks:
            return index
    raise ValueError(f"rank {rank} is on no host")


@dataclass
class Phases:
    """A matched collective's work on this host: groups for the AI cores before and after
    (server/hccl/reduce_plan.py's form), and the exchange's steps between. Built by `plan`."""

    block_bytes: int
    before: list
    steps: list[Step]
    after: list


def _even(count: int, itemsize: int, hosts: int) -> tuple:
    bounds = [count * h // hosts * itemsize for h in range(hosts + 1)]
    return tuple(((bounds[h], bounds[h + 1]),) for h in range(hosts))


def _slices(hosts: Hosts, size: int) -> tuple:
    return tuple(tuple((r * size, (r + 1) * size) for r in ranks) for _, ranks in hosts)


def plan(hosts: Hosts, host: int, calls: dict[int, Call], block: Span, first_seq: int) -> Phases:
    """The phases of a matched collective on host `host` of `hosts`; `calls[r]` is local
    rank r's Call, `block` the host block. Its steps are numbered from `first_seq` and start
    with a Match of every host's call."""
    call = next(iter(calls.values()))
    seq = iter(range(first_seq + 1, first_seq + 3))
    phases = _phases(hosts, host, call, calls, block, seq)
    phases.steps.insert(0, Match(first_seq, call.describe().encode()))
    return phases


def _phases(
    hosts: Hosts, host: int, call: Call, calls: dict[int, Call], block: Span, seq
) -> Phases:
    kind, count, root, op = call.kind, call.elements, call.root, call.op
    itemsize = ht.ITEM_SIZES.get(call.dtype, 1)
    dtype = ht.DTYPE_NAMES.get(call.dtype, "uint8")
    size = count * itemsize
    mine = sorted(calls)
    sends = [calls[r].send for r in mine]
    recvs = [calls[r].recv for r in mine]
    host_count = len(hosts)
    offset = block.offset
    if kind == ht.HCCL_CMD_BARRIER:
        owners = tuple(((h, h + 1),) for h in range(host_count))
        return Phases(host_count, [], [Gather(next(seq), offset, owners)], [])
    if count == 0:
        return Phases(0, [], [], [])
    n = sum(len(ranks) for _, ranks in hosts)
    if kind == ht.HCCL_CMD_ALLREDUCE:
        owners = _even(count, itemsize, host_count)
        return Phases(
            size,
            [(tuple(sends), (block,), count)],
            [Reduce(next(seq), offset, dtype, op, owners), Gather(next(seq), offset, owners)],
            [((block,), tuple(recvs), count)],
        )
    if kind == ht.HCCL_CMD_REDUCE_SCATTER:
        return Phases(
            n * size,
            [(tuple(sends), (block,), n * count)],
            [Reduce(next(seq), offset, dtype, op, _slices(hosts, size))],
            [((block.at(r * size),), (recvs[i],), count) for i, r in enumerate(mine)],
        )
    if kind == ht.HCCL_CMD_ALLGATHER:
        return Phases(
            n * size,
            [((sends[i],), (block.at(r * size),), count) for i, r in enumerate(mine)],
            [Gather(next(seq), offset, _slices(hosts, size))],
            [((block,), tuple(recvs), n * count)],
        )
    root_host = host_of(hosts, root)
    whole = tuple(((0, size),) if h == root_host else () for h in range(host_count))
    if kind == ht.HCCL_CMD_BROADCAST:  # each rank's buffer is its send
        before = [((calls[root].send,), (block,), count)] if root in calls else []
        others = tuple(s for r, s in zip(mine, sends) if r != root)
        return Phases(
            size,
            before,
            [Gather(next(seq), offset, whole)],
            [((block,), others, count)] if others else [],
        )
    if kind == ht.HCCL_CMD_REDUCE:
        after = [((block,), (calls[root].recv,), count)] if root in calls else []
        return Phases(
            size,
            [(tuple(sends), (block,), count)],
            [Reduce(next(seq), offset, dtype, op, whole)],
            after,
        )
    part = _HostPart(hosts, host, n, mine, sends, recvs, block, count, size, next(seq))
    if kind == ht.HCCL_CMD_SCATTER:
        return _scatter(part, calls[root].send if root in calls else None, root_host)
    if kind == ht.HCCL_CMD_ALLTOALL:
        return _alltoall(part)
    raise ValueError(f"collective {kind} does not run across hosts")


class _HostPart(NamedTuple):
    """This host's part of a scatter or alltoall, for their planners: its ranks and their
    buffers, the host block, and the size of one rank's slice."""

    hosts: Hosts
    host: int  # this host's index
    n_ranks: int  # in the world
    mine: list  # the local ranks, in order
    sends: list  # their send buffers
    recvs: list  # their recv buffers
    block: Span
    elements: int  # per slice
    size: int  # bytes per slice
    seq: int  # the Exchange step's


def _scatter(part: _HostPart, source: Span | None, root_host: int) -> Phases:
    """scatter, laid out by global rank in the block: the root's host (`source`: the root's
    send buffer) copies its own ranks' slices straight to them and the other hosts' ranks'
    slices into the block, then sends each host its ranks' slices; that host copies them
    out."""
    mine, recvs, block, count, size, n = (
        part.mine,
        part.recvs,
        part.block,
        part.elements,
        part.size,
        part.n_ranks,
    )
    if source is not None:
        others = [(h, r) for h, (_, rs) in enumerate(part.hosts) if h != part.host for r in rs]
        before = [((source.at(r * size),), (recvs[i],), count) for i, r in enumerate(mine)]
        before += [((source.at(r * size),), (block.at(r * size),), count) for _, r in others]
        sends = tuple((h, (r * size, (r + 1) * size)) for h, r in others)
        return Phases(n * size, before, [Exchange(part.seq, block.offset, sends, ())], [])
    receives = tuple((root_host, (r * size, (r + 1) * size)) for r in mine)
    after = [((block.at(r * size),), (recvs[i],), count) for i, r in enumerate(mine)]
    return Phases(n * size, [], [Exchange(part.seq, block.offset, (), receives)], after)


def _alltoall(part: _HostPart) -> Phases:
    """alltoall (rank i's slice j to rank j's slice i): slices between this host's ranks
    are copied straight; for each other host g, the block holds what leaves for g ([local
    rank i][g's rank j]) and what comes from g ([g's rank i][local rank j]), each in one
    range, exchanged with g at once."""
    mine, sends, recvs, block, count, size = (
        part.mine,
        part.sends,
        part.recvs,
        part.block,
        part.elements,
        part.size,
    )
    local = len(mine)
    peers = [(g, ranks) for g, (_, ranks) in enumerate(part.hosts) if g != part.host]
    before = [
        ((sends[a].at(j * size),), (recvs[b].at(i * size),), count)
        for a, i in enumerate(mine)
        for b, j in enumerate(mine)
    ]
    after, out, into, at = [], [], [], 0
    for g, ranks in peers:
        for a in range(local):
            for k, j in enumerate(ranks):
                before.append(
                    ((sends[a].at(j * size),), (block.at(at + (a * len(ranks) + k) * size),), count)
                )
        out.append((g, (at, at + local * len(ranks) * size)))
        at += local * len(ranks) * size
    for g, ranks in peers:
        for k, i in enumerate(ranks):
            for b in range(local):
                after.append(
                    ((block.at(at + (k * local + b) * size),), (recvs[b].at(i * size),), count)
                )
        into.append((g, (at, at + len(ranks) * local * size)))
        at += len(ranks) * local * size
    return Phases(at, before, [Exchange(part.seq, block.offset, tuple(out), tuple(into))], after)
