"""Scheduling policies: small pure functions, unit-tested on plain lists."""

from __future__ import annotations


def pick_stream(priorities: list[int]) -> int:
    """Index of the ready stream to serve next: the highest priority (lowest number) wins,
    and among equals the one that has been ready longest (the earliest in the list)."""
    best = 0
    for index in range(1, len(priorities)):
        if priorities[index] < priorities[best]:
            best = index
    return best


def block_chunk(remaining: int, total_cores: int) -> int:
    """How many of a launch's remaining blocks to hand one free AI core at once.

    An even share of what is left over all cores of the device, so that a launch with
    numBlocks = cores runs one block per core, and a big launch costs a handful of
    messages rather than one per block.
    """
    return max(1, -(-remaining // total_cores))


MAX_RUN = 64


def run_length(num_blocks_of_following: list[int], limit: int = MAX_RUN) -> int:
    """How many of the kernels queued behind a single-block launch on the same stream to
    hand the same core in one message ("task aggregation").

    Stream order makes them run one after the other anyway, so a run of consecutive
    single-block launches loses no parallelism by going to one core, and saves a message
    and a wake-up per task. The run stops at the first launch with several blocks.
    """
    count = 0
    for blocks in num_blocks_of_following:
        if blocks != 1 or count >= limit - 1:
            break
        count += 1
    return count


MIN_COPY_PIECE = 4 << 20


def copy_pieces(count: int, engines: int, synchronous: bool) -> int:
    """How many copy engines share one copy or memset of `count` bytes.

    A synchronous one (aclrtMemcpy, aclrtMemset: the caller waits for it and nothing else)
    of 8 MiB or more takes all of them, so it goes faster than one memcpy. A stream's copy
    goes whole to one engine: the engines and AI cores are processes on the host's few
    CPUs, and a second piece would take the CPU of the kernel the copy should overlap
    with -- overlap being the point of putting copies on streams.
    """
    if not synchronous:
        return 1
    return max(1, min(engines, count // MIN_COPY_PIECE))


def piece_range(count: int, pieces: int, index: int) -> tuple[int, int]:
    """[start, end) of piece `index` of `pieces`, on 64-byte boundaries."""
    def edge(i: int) -> int:
        return count if i == pieces else (count * i // pieces) & ~63
    return edge(index), edge(index + 1)
