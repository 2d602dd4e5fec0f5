"""The plan of a collective across hosts (server/hccl/world_plan.py), on plain memory: every
host's plan is run here as the AI cores and the exchange processes would run it (groups on
bytes, steps between the hosts' blocks), and each rank must end with what the collective
means -- no daemon, no process."""

from __future__ import annotations

import numpy as np
import pytest

from simnpu.proto import hccl_types as ht
from simnpu.server.core.unit_protocol import Span
from simnpu.server.hccl.collectives import Call
from simnpu.server.hccl.gloo_exchange_protocol import Exchange, Gather, Match, Reduce
from simnpu.server.hccl.world_plan import Hosts, Phases, host_of, plan

INT32 = ht.HCCL_DATA_TYPE_INT32
SLOT = 4 << 10  # each rank's send at r * SLOT, its recv at (16 + r) * SLOT of its host
BLOCK = 32 * SLOT  # the host block's offset in each host's segment
SEGMENT_BYTES = 64 * SLOT
COUNT = 5  # elements per rank (per slice for the sliced collectives)

LAYOUTS = {
    "2 hosts, 2 ranks each": ((0, 1), (2, 3)),
    "2 hosts, ranks interleaved": ((0, 2), (1, 3, 4)),
    "3 hosts, uneven": ((0,), (1, 2), (3,)),
}


def hosts_of(layout: tuple) -> Hosts:
    return tuple((f"10.0.0.{h + 1}:7000", ranks) for h, ranks in enumerate(layout))


def segment(host: int) -> str:
    return f"host{host}"


def send_of(hosts: Hosts, rank: int) -> Span:
    return Span(segment(host_of(hosts, rank)), rank * SLOT, 0)


def recv_of(hosts: Hosts, rank: int) -> Span:
    return Span(segment(host_of(hosts, rank)), (16 + rank) * SLOT, 0)


def view(memory: dict, span: Span, count: int) -> np.ndarray:
    return np.frombuffer(memory[span.segment], np.int32, count, span.offset)


def run_groups(memory: dict, groups: list) -> None:
    """Groups as the AI cores run them: each sums its sources into its destinations."""
    for sources, destinations, count in groups:
        result = sum(view(memory, s, count).astype(np.int64) for s in sources)
        for destination in destinations:
            view(memory, destination, count)[:] = result


def block_bytes(memory: dict, host: int, block: int, span: tuple) -> np.ndarray:
    return np.frombuffer(memory[segment(host)], np.uint8, span[1] - span[0], block + span[0])


def run_steps(memory: dict, plans: list[Phases]) -> None:
    """Every host's steps, side by side, as the exchange processes run them."""
    assert len({len(p.steps) for p in plans}) == 1, "every host plans as many steps"
    for steps in zip(*(p.steps for p in plans)):
        first = steps[0]
        assert {type(s) for s in steps} == {type(first)} and {s.seq for s in steps} == {first.seq}
        if isinstance(first, Match):
            assert len({s.call for s in steps}) == 1
        elif isinstance(first, Reduce):
            assert len({s.owners for s in steps}) == 1
            sums = {
                (h, span): sum(
                    block_bytes(memory, g, steps[g].block, span).view(np.int32).astype(np.int64)
                    for g in range(len(steps))
                )
                for h, ranges in enumerate(first.owners)
                for span in ranges
            }
            for (h, span), total in sums.items():
                block_bytes(memory, h, steps[h].block, span).view(np.int32)[:] = total
        elif isinstance(first, Gather):
            assert len({s.owners for s in steps}) == 1
            for h, ranges in enumerate(first.owners):
                for span in ranges:
                    for g in range(len(steps)):
                        if g != h:
                            mine = block_bytes(memory, h, steps[h].block, span)
                            block_bytes(memory, g, steps[g].block, span)[:] = mine
        else:
            assert isinstance(first, Exchange)
            for h, step in enumerate(steps):
                for p, theirs in enumerate(steps):
                    out = [span for peer, span in step.sends if peer == p]
                    into = [span for peer, span in theirs.recvs if peer == h]
                    assert [b - a for a, b in out] == [b - a for a, b in into], (h, p)
                    for a, b in zip(out, into):
                        block_bytes(memory, p, theirs.block, b)[:] = block_bytes(
                            memory, h, step.block, a
                        )


def run_world(layout: tuple, kind: int, root: int = 0, first_seq: int = 0):
    """Plan `kind` on every host of `layout` and run the plans; the ranks' sends (rank r's
    element i is 1000 r + i) and the memory after."""
    hosts = hosts_of(layout)
    n = sum(len(ranks) for ranks in layout)
    sliced = (ht.HCCL_CMD_REDUCE_SCATTER, ht.HCCL_CMD_ALLTOALL, ht.HCCL_CMD_SCATTER)
    per_rank = COUNT * n if kind in sliced else COUNT  # elements of each rank's send
    memory = {segment(h): bytearray(SEGMENT_BYTES) for h in range(len(layout))}
    sends = {}
    for r in range(n):
        sends[r] = np.arange(per_rank, dtype=np.int32) + 1000 * r
        view(memory, send_of(hosts, r), per_rank)[:] = sends[r]
    plans = []
    for h, ranks in enumerate(layout):
        calls = {}
        for r in ranks:
            send = send_of(hosts, r)
            recv = send if kind == ht.HCCL_CMD_BROADCAST else recv_of(hosts, r)
            calls[r] = Call(
                kind, COUNT, INT32, ht.HCCL_REDUCE_SUM, root, send, recv, COUNT, INT32, 0, 0
            )
        phases = plan(hosts, h, calls, Span(segment(h), BLOCK, 0), first_seq)
        assert phases.block_bytes <= SEGMENT_BYTES - BLOCK
        plans.append(phases)
    for phases in plans:
        run_groups(memory, phases.before)
    run_steps(memory, plans)
    for phases in plans:
        run_groups(memory, phases.after)
    return hosts, n, sends, memory


def received(memory: dict, hosts: Hosts, rank: int, count: int) -> np.ndarray:
    return view(memory, recv_of(hosts, rank), count)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_all_reduce_gives_every_rank_the_sum(layout):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_ALLREDUCE)
    total = sum(sends[r] for r in range(n))
    for r in range(n):
        assert np.array_equal(received(memory, hosts, r, COUNT), total)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_reduce_scatter_gives_each_rank_the_sum_of_its_slice(layout):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_REDUCE_SCATTER)
    total = sum(sends[r] for r in range(n))
    for r in range(n):
        assert np.array_equal(received(memory, hosts, r, COUNT), total[r * COUNT : (r + 1) * COUNT])


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_all_gather_gives_every_rank_every_send_in_rank_order(layout):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_ALLGATHER)
    everything = np.concatenate([sends[r] for r in range(n)])
    for r in range(n):
        assert np.array_equal(received(memory, hosts, r, n * COUNT), everything)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("root", [0, 3])
def test_broadcast_gives_every_rank_the_roots_buffer(layout, root):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_BROADCAST, root)
    for r in range(n):
        assert np.array_equal(view(memory, send_of(hosts, r), COUNT), sends[root])


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("root", [0, 3])
def test_reduce_gives_the_root_the_sum_and_the_others_nothing(layout, root):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_REDUCE, root)
    total = sum(sends[r] for r in range(n))
    for r in range(n):
        want = total if r == root else np.zeros(COUNT, np.int32)
        assert np.array_equal(received(memory, hosts, r, COUNT), want)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("root", [0, 3])
def test_scatter_gives_each_rank_its_slice_of_the_roots_send(layout, root):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_SCATTER, root)
    for r in range(n):
        want = sends[root][r * COUNT : (r + 1) * COUNT]
        assert np.array_equal(received(memory, hosts, r, COUNT), want)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_alltoall_gives_rank_j_slice_j_of_every_rank_in_rank_order(layout):
    hosts, n, sends, memory = run_world(layout, ht.HCCL_CMD_ALLTOALL)
    for j in range(n):
        want = np.concatenate([sends[i][j * COUNT : (j + 1) * COUNT] for i in range(n)])
        assert np.array_equal(received(memory, hosts, j, n * COUNT), want)


def test_steps_are_numbered_from_first_seq_and_start_with_a_match_of_the_call():
    hosts = hosts_of(((0, 1), (2, 3)))
    call = Call(
        ht.HCCL_CMD_ALLREDUCE,
        12,
        INT32,
        ht.HCCL_REDUCE_SUM,
        0,
        send_of(hosts, 0),
        recv_of(hosts, 0),
        12,
        INT32,
        48,
        48,
    )
    block = Span(segment(0), BLOCK, 0)
    phases = plan(hosts, 0, {0: call, 1: call._replace(send=send_of(hosts, 1))}, block, 7)
    assert [s.seq for s in phases.steps] == [7, 8, 9]
    assert phases.steps[0] == Match(7, b"all_reduce(count=12, int32, sum)")
    owners = (((0, 24),), ((24, 48),))  # 12 int32s cut evenly between the 2 hosts
    assert phases.steps[1:] == [
        Reduce(8, BLOCK, "int32", ht.HCCL_REDUCE_SUM, owners),
        Gather(9, BLOCK, owners),
    ]
    assert phases.block_bytes == 48


def test_a_barrier_gathers_a_byte_per_host_and_a_count_of_zero_only_matches():
    hosts = hosts_of(((0,), (1,), (2,)))
    block = Span(segment(1), BLOCK, 0)
    barrier = Call(ht.HCCL_CMD_BARRIER, 0, INT32, 0, 0, block, block, 0, INT32, 0, 0)
    phases = plan(hosts, 1, {1: barrier}, block, 0)
    assert phases == Phases(
        3, [], [Match(0, b"barrier()"), Gather(1, BLOCK, (((0, 1),), ((1, 2),), ((2, 3),)))], []
    )
    empty = barrier._replace(kind=ht.HCCL_CMD_ALLREDUCE)
    phases = plan(hosts, 1, {1: empty}, block, 5)
    assert phases == Phases(0, [], [Match(5, b"all_reduce(count=0, int32, sum)")], [])


def test_host_of_names_the_host_that_serves_a_rank():
    hosts = hosts_of(((0, 2), (1, 3, 4)))
    assert [host_of(hosts, r) for r in range(5)] == [0, 1, 0, 1, 1]
    with pytest.raises(ValueError, match="rank 5 is on no host"):
        host_of(hosts, 5)


def test_a_send_is_not_planned_as_a_collective():
    hosts = hosts_of(((0,), (1,)))
    span = Span(segment(0), 0, 0)
    send = Call(ht.HCCL_CMD_SEND, 4, INT32, 0, 1, span, span, 4, INT32, 16, 0)
    with pytest.raises(ValueError, match="does not run across hosts"):
        plan(hosts, 0, {0: send}, Span(segment(0), BLOCK, 0), 0)
