"""Scheduling policies on plain lists (the scheduler's and its task kinds'): which ready
stream goes first, which client a free AI core serves, how blocks are split, how many
single-block launches ride along, how copies are cut."""

import itertools

import pytest

from simnpu.server.core.scheduler import pick_client, pick_stream
from simnpu.server.core.tasks.copy import MIN_COPY_PIECE, copy_pieces, piece_range
from simnpu.server.core.tasks.kernel import (
    MAX_RUN,
    RUN_BUDGET_NS,
    block_chunk,
    run_budget,
    run_length,
)


class TestPickStream:
    def test_single_stream(self):
        assert pick_stream([5]) == 0

    def test_highest_priority_is_the_lowest_number(self):
        assert pick_stream([3, 1, 7, 2]) == 1
        assert pick_stream([7, 6, 5, 4, 3, 2, 1, 0]) == 7

    def test_ties_go_to_the_stream_ready_longest(self):
        assert pick_stream([2, 0, 0, 0]) == 1
        assert pick_stream([4, 4, 4]) == 0

    def test_immediate_copies_jump_every_stream(self):
        """Synchronous copies run on a hidden stream of priority -1."""
        assert pick_stream([0, 0, -1, 0, -1]) == 2

    def test_matches_a_stable_minimum(self):
        lists = [[0], [1, 0], [0, 1], [7, 3, 3, 0, 0, 7], list(range(8))[::-1], [5] * 9]
        for priorities in lists:
            expected = min(range(len(priorities)), key=lambda i: (priorities[i], i))
            assert pick_stream(priorities) == expected

    def test_does_not_modify_its_input(self):
        priorities = [3, 0, 2]
        pick_stream(priorities)
        assert priorities == [3, 0, 2]


class TestPickClient:
    """`turns`: per ready stream, when its client last got an AI core (0: never)."""

    def test_the_client_served_longest_ago_goes_next(self):
        assert pick_client([9, 9, 9, 4]) == 3  # one stream of its own against three
        assert pick_client([7, 3, 7, 3]) == 1

    def test_a_client_never_served_goes_before_any_served(self):
        assert pick_client([5, 8, 0]) == 2

    def test_among_clients_never_served_the_one_ready_longest(self):
        assert pick_client([0, 0, 6]) == 0
        assert pick_client([6, 0, 0]) == 1

    def test_turns_rotate_whatever_the_number_of_streams(self):
        """Three clients of 5, 1 and 2 ready streams, always ready, take a free core in
        turn: the one served is given the next turn number."""
        clients = [0] * 5 + [1] + [2] * 2
        last = {0: 0, 1: 0, 2: 0}
        served = []
        for turn in range(1, 10):
            client = clients[pick_client([last[c] for c in clients])]
            last[client] = turn
            served.append(client)
        assert served == [0, 1, 2] * 3


class TestRunBudget:
    """`ran_ns`: how long the head launch, then each kernel queued behind it, ran last."""

    def test_tiny_kernels_ride_along_up_to_the_budget(self):
        assert run_budget([10_000] * 64) == 63
        assert run_budget([400_000, 400_000, 400_000]) == 1
        assert run_budget([100, 200, 300], budget_ns=600) == 2
        assert run_budget([100, 200, 301], budget_ns=600) == 1

    def test_a_head_over_the_budget_runs_alone(self):
        assert run_budget([RUN_BUDGET_NS + 1, 10]) == 0
        assert run_budget([200_000_000]) == 0

    def test_a_kernel_never_seen_to_run_ends_the_run(self):
        assert run_budget([None, 10, 10]) == 0
        assert run_budget([10, 10, None, 10]) == 1

    def test_nothing_queued(self):
        assert run_budget([10]) == 0
        assert run_budget([]) == 0

    def test_the_budget_is_about_a_millisecond(self):
        """Long enough for a full run of empty kernels, short beside the kernels of a real
        workload: the longest a client waits for a core behind another's run."""
        assert 500_000 <= RUN_BUDGET_NS <= 2_000_000


class TestBlockChunk:
    @pytest.mark.parametrize("cores", [1, 2, 3, 8])
    def test_numblocks_equal_to_cores_gives_one_block_per_core(self, cores):
        remaining, chunks = cores, []
        while remaining:
            chunks.append(block_chunk(remaining, cores))
            remaining -= chunks[-1]
        assert chunks == [1] * cores

    def test_even_share_rounded_up(self):
        assert block_chunk(10, 2) == 5
        assert block_chunk(11, 2) == 6
        assert block_chunk(7, 3) == 3
        assert block_chunk(100, 8) == 13

    def test_never_zero(self):
        assert block_chunk(1, 8) == 1
        assert block_chunk(0, 8) == 1

    def test_one_core_takes_everything(self):
        assert block_chunk(1000, 1) == 1000

    @pytest.mark.parametrize(
        "blocks,cores", [(1, 2), (2, 2), (5, 2), (48, 2), (65535, 2), (9, 4), (100, 7)]
    )
    def test_handing_out_covers_every_block_once_in_few_chunks(self, blocks, cores):
        first, chunks = 0, []
        while first < blocks:
            last = min(blocks, first + block_chunk(blocks - first, cores))
            assert last > first
            chunks.append((first, last))
            first = last
        assert chunks[0][0] == 0 and chunks[-1][1] == blocks
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
        # each chunk is at most an even share of what was left, so all cores get work
        assert chunks[0][1] - chunks[0][0] == -(-blocks // cores)
        assert len(chunks) <= cores * max(1, blocks.bit_length())


class TestRunLength:
    def test_empty(self):
        assert run_length([]) == 0

    def test_all_single_block(self):
        assert run_length([1, 1, 1]) == 3

    def test_stops_at_the_first_multi_block_launch(self):
        assert run_length([1, 1, 4, 1, 1]) == 2
        assert run_length([2, 1, 1]) == 0

    def test_bounded_by_the_limit_including_the_head_launch(self):
        assert run_length([1] * 200) == MAX_RUN - 1
        assert run_length([1] * 10, limit=4) == 3
        assert run_length([1] * 3, limit=4) == 3
        assert run_length([1] * 10, limit=1) == 0

    def test_max_run_is_sane(self):
        assert MAX_RUN >= 2


class TestCopyPieces:
    def test_a_streams_copy_goes_whole_to_one_engine(self):
        assert copy_pieces(64 * MIN_COPY_PIECE, 4, synchronous=False) == 1

    def test_a_big_synchronous_copy_takes_every_engine(self):
        assert copy_pieces(2 * MIN_COPY_PIECE, 2, synchronous=True) == 2
        assert copy_pieces(64 * MIN_COPY_PIECE, 4, synchronous=True) == 4
        assert copy_pieces(64 * MIN_COPY_PIECE, 1, synchronous=True) == 1

    def test_a_small_synchronous_copy_takes_one_engine(self):
        assert copy_pieces(0, 2, synchronous=True) == 1
        assert copy_pieces(2 * MIN_COPY_PIECE - 1, 2, synchronous=True) == 1

    def test_pieces_cover_the_copy_on_64_byte_edges(self):
        for count, pieces in ((10 << 20, 2), ((64 << 20) + 3, 3)):
            ranges = [piece_range(count, pieces, i) for i in range(pieces)]
            assert ranges[0][0] == 0 and ranges[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert all(start % 64 == 0 for start, _ in ranges)
