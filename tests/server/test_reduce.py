"""The data movement of collectives on plain memory: plans, splitting, in place, snapshots,
and bit-for-bit identical results however the work is cut."""

import ml_dtypes
import numpy as np
import pytest

from simnpu.proto import hccl_types as ht
from simnpu.server.core.unit_protocol import Span
from simnpu.server.hccl import reduce_plan
from simnpu.server.units import collective_pieces

RANK_BYTES = 1 << 16  # each rank's send at r * RANK_BYTES, recv at 64 KiB * (8 + r) of "device" 0


def memory(n_bytes=1 << 20):
    return {"dev0": bytearray(n_bytes)}


def at(offset):
    return Span("dev0", offset, 0)


def view(maps, offset, dtype, count):
    return np.frombuffer(maps["dev0"], dtype, count, offset)


def run_plan(
    maps, kind, n, count, dtype, op=ht.HCCL_REDUCE_SUM, root=0, pieces=1, sends=None, recvs=None
):
    dt = np.dtype(dtype)
    sends = sends or [at(r * RANK_BYTES) for r in range(n)]
    recvs = recvs or [at((8 + r) * RANK_BYTES) for r in range(n)]
    groups = reduce_plan.plan(kind, sends, recvs, count, root, dt.itemsize)
    snapshot = reduce_plan.needs_snapshot(groups, dt.itemsize)
    for piece in reduce_plan.split(groups, 1 if snapshot else pieces):
        collective_pieces.run(maps, dt.name, op, groups, snapshot, piece)
    return snapshot


def fill(maps, n, count, dtype, seed=0):
    rng = np.random.default_rng(seed)
    inputs = []
    for r in range(n):
        data = (rng.standard_normal(count) * 100).astype(dtype)
        view(maps, r * RANK_BYTES, dtype, count)[:] = data
        inputs.append(data)
    return inputs


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, np.int32, np.uint8, np.dtype(ml_dtypes.bfloat16)]
)
@pytest.mark.parametrize(
    "op, ufunc",
    [
        (ht.HCCL_REDUCE_SUM, np.add),
        (ht.HCCL_REDUCE_PROD, np.multiply),
        (ht.HCCL_REDUCE_MAX, np.maximum),
        (ht.HCCL_REDUCE_MIN, np.minimum),
    ],
)
def test_all_reduce_is_rank_ordered_and_the_same_however_cut(dtype, op, ufunc, monkeypatch):
    n, count = 4, 5000
    maps = memory()
    inputs = fill(maps, n, count, dtype)
    expected = inputs[0].copy()
    with np.errstate(all="ignore"):
        for data in inputs[1:]:
            expected = ufunc(expected, data).astype(dtype)
    results = []
    for pieces, block in ((1, collective_pieces.REDUCE_BLOCK_BYTES), (3, 256), (7, 64)):
        monkeypatch.setattr(collective_pieces, "REDUCE_BLOCK_BYTES", block)
        run_plan(maps, ht.HCCL_CMD_ALLREDUCE, n, count, dtype, op, pieces=pieces)
        for r in range(n):
            got = view(maps, (8 + r) * RANK_BYTES, dtype, count)
            assert got.tobytes() == expected.tobytes()
        results.append(view(maps, 8 * RANK_BYTES, dtype, count).tobytes())
    assert len(set(results)) == 1


def test_all_reduce_in_place():
    n, count = 3, 4000
    maps = memory()
    inputs = fill(maps, n, count, np.float32)
    sends = [at(r * RANK_BYTES) for r in range(n)]
    assert not run_plan(
        maps, ht.HCCL_CMD_ALLREDUCE, n, count, np.float32, sends=sends, recvs=sends, pieces=2
    )
    expected = (inputs[0] + inputs[1]) + inputs[2]
    for r in range(n):
        assert np.array_equal(view(maps, r * RANK_BYTES, np.float32, count), expected)


def test_all_gather_reduce_scatter_alltoall_scatter_broadcast():
    n, count = 4, 1000
    maps = memory()
    inputs = fill(maps, n, 4 * count, np.int32)
    run_plan(maps, ht.HCCL_CMD_ALLGATHER, n, count, np.int32, pieces=3)
    gathered = np.concatenate([data[:count] for data in inputs])
    for r in range(n):
        assert np.array_equal(view(maps, (8 + r) * RANK_BYTES, np.int32, n * count), gathered)
    run_plan(maps, ht.HCCL_CMD_REDUCE_SCATTER, n, count, np.int32, pieces=2)
    total = sum(inputs[1:], inputs[0])
    for r in range(n):
        assert np.array_equal(
            view(maps, (8 + r) * RANK_BYTES, np.int32, count), total[r * count : (r + 1) * count]
        )
    run_plan(maps, ht.HCCL_CMD_ALLTOALL, n, count, np.int32, pieces=5)
    for j in range(n):
        expected = np.concatenate([inputs[i][j * count : (j + 1) * count] for i in range(n)])
        assert np.array_equal(view(maps, (8 + j) * RANK_BYTES, np.int32, n * count), expected)
    run_plan(maps, ht.HCCL_CMD_SCATTER, n, count, np.int32, root=2)
    for r in range(n):
        assert np.array_equal(
            view(maps, (8 + r) * RANK_BYTES, np.int32, count),
            inputs[2][r * count : (r + 1) * count],
        )
    run_plan(maps, ht.HCCL_CMD_BROADCAST, n, count, np.int32, root=1, pieces=2)
    for r in range(n):
        assert np.array_equal(view(maps, r * RANK_BYTES, np.int32, count), inputs[1][:count])


def test_nccl_in_place_layouts_need_no_snapshot():
    n, count, size = 4, 500, 2000
    maps = memory()
    recvs = [at((8 + r) * RANK_BYTES) for r in range(n)]
    for r in range(n):  # all_gather in place: send = recv + r * count
        view(maps, (8 + r) * RANK_BYTES + r * size, np.float32, count)[:] = r + 1
    sends = [at((8 + r) * RANK_BYTES + r * size) for r in range(n)]
    assert not run_plan(
        maps, ht.HCCL_CMD_ALLGATHER, n, count, np.float32, sends=sends, recvs=recvs, pieces=3
    )
    for r in range(n):
        assert np.array_equal(
            view(maps, (8 + r) * RANK_BYTES, np.float32, n * count),
            np.repeat(np.arange(1, n + 1, dtype=np.float32), count),
        )
    inputs = fill(
        maps, n, n * count, np.float32
    )  # reduce_scatter in place: recv = send + r * count
    sends = [at(r * RANK_BYTES) for r in range(n)]
    recvs = [at(r * RANK_BYTES + r * size) for r in range(n)]
    assert not run_plan(
        maps, ht.HCCL_CMD_REDUCE_SCATTER, n, count, np.float32, sends=sends, recvs=recvs, pieces=2
    )
    total = ((inputs[0] + inputs[1]) + inputs[2]) + inputs[3]
    for r in range(n):
        assert np.array_equal(
            view(maps, r * RANK_BYTES + r * size, np.float32, count),
            total[r * count : (r + 1) * count],
        )


@pytest.mark.parametrize("kind", [ht.HCCL_CMD_ALLGATHER, ht.HCCL_CMD_ALLTOALL])
def test_send_equal_recv_takes_a_snapshot_and_is_still_right(kind):
    n, count = 3, 700
    maps = memory()
    per_rank = n * count  # every rank's buffer holds n blocks; send == recv
    inputs = fill(maps, n, per_rank, np.int64)
    buffers = [at(r * RANK_BYTES) for r in range(n)]
    assert run_plan(maps, kind, n, count, np.int64, sends=buffers, recvs=buffers, pieces=4)
    for r in range(n):
        got = view(maps, r * RANK_BYTES, np.int64, per_rank)
        if kind == ht.HCCL_CMD_ALLGATHER:
            expected = np.concatenate([inputs[i][:count] for i in range(n)])
        else:
            expected = np.concatenate([inputs[i][r * count : (r + 1) * count] for i in range(n)])
        assert np.array_equal(got, expected)


def test_split_covers_every_element_once():
    groups = [((0,), (1,), 10), ((0,), (1,), 0), ((0,), (1,), 7), ((0,), (1,), 1)]
    for pieces in range(1, 25):
        seen = {g: [] for g in range(len(groups))}
        parts = reduce_plan.split(groups, pieces)
        assert len(parts) == min(pieces, 18)
        for piece in parts:
            assert piece
            for g, first, end in piece:
                assert 0 <= first < end <= groups[g][2]
                seen[g].extend(range(first, end))
        assert all(sorted(seen[g]) == list(range(groups[g][2])) for g in seen)


def test_plans_drop_self_copies_and_empty_collectives():
    assert reduce_plan.plan(ht.HCCL_CMD_BARRIER, [(0, 0)] * 2, [(0, 0)] * 2, 5, 0, 4) == []
    assert reduce_plan.plan(ht.HCCL_CMD_ALLREDUCE, [(0, 0)] * 2, [(0, 8)] * 2, 0, 0, 4) == []
    assert reduce_plan.plan(ht.HCCL_CMD_BROADCAST, [(0, 0)], [(0, 0)], 5, 0, 4) == []  # one rank
    groups = reduce_plan.plan(ht.HCCL_CMD_BROADCAST, [(0, 0), (1, 64)], [(0, 0), (1, 64)], 5, 0, 4)
    assert groups == [(((0, 0),), ((1, 64),), 5)]


def test_piece_count():
    assert reduce_plan.piece_count(10, 8) == 1
    assert reduce_plan.piece_count(reduce_plan.MIN_PIECE_BYTES * 3, 2) == 3
    assert (
        reduce_plan.piece_count(reduce_plan.MIN_PIECE_BYTES * 100, 2)
        == 2 * reduce_plan.PIECES_PER_CORE
    )
    assert reduce_plan.piece_count(reduce_plan.MIN_PIECE_BYTES * 100, 0) == 1
