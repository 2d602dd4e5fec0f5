"""Allocation traces that look like deep-learning training, their replay, and the two
classic allocators simnpu's is compared with (a naive first fit and a binary buddy).

A trace is a list of events, `("a", id, size)` or `("f", id)`, generated from a seed:

- weights: one buffer per parameter tensor, allocated first and never freed (512 B to
  64 MiB, log-uniform, plus a few 256 MiB embedding tables);
- optimizer state: two buffers per parameter, created during the first step, so they land
  between that step's activations (the classic source of fragmentation);
- every step has its own batch size (varying, or growing for the out-of-memory replay):
  the forward pass allocates each layer's activations and a short-lived workspace; some
  layers (attention) add a large temporary that scales with the batch squared, capped at
  256 MiB; a few activations are kept one more step (checkpointing stragglers);
- the backward pass walks the layers in reverse, allocating activation and weight
  gradients, freeing activations as it goes (mostly but not strictly LIFO: frees are
  shuffled within a window), and the optimizer step frees the weight gradients.

`replay` runs a trace against any allocator with `allocate(size, policy)` / `free(offset)`
and reports the peak address span (highest end of a live block) over the peak of live
requested bytes, and, when it runs out of memory, how much of the region was in use.
"""

from __future__ import annotations

import math
import random

from simnpu.proto.errors import NpuMemoryError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def dl_trace(
    seed: int = 0, steps: int = 12, layers: int = 48, grow: float = 0.0, batch: int = 8
) -> list[tuple]:
    """A training-like trace (see the module docstring); `grow` > 0 multiplies the batch size
    by (1 + grow) every step (the out-of-memory replay)."""
    rng = random.Random(seed)
    events: list[tuple] = []
    ids = iter(range(1 << 62))

    def alloc(size: int) -> int:
        i = next(ids)
        events.append(("a", i, max(512, min(int(size), 256 * MiB))))
        return i

    def free(i: int) -> None:
        events.append(("f", i))

    params = [_log_uniform(rng, 512, 64 * MiB) for _ in range(layers * 3)]
    params += [256 * MiB] * 2
    for size in params:
        alloc(size)
    width = [
        _log_uniform(rng, 4 * KiB, 2 * MiB) for _ in range(layers)
    ]  # activation bytes per sample
    attention = {i for i in range(layers) if rng.random() < 0.2}
    optimizer_created = False
    stragglers: list[int] = []
    for step in range(steps):
        b = batch * (1 + grow) ** step if grow else batch * rng.choice([1, 1, 2, 3, 4])
        activations = []
        for layer in range(layers):
            activations.append(alloc(width[layer] * b))
            workspace = alloc(_log_uniform(rng, 512, 8 * MiB))
            if layer in attention:
                scores = alloc(min(256 * MiB, 64 * KiB * b * b))
                free(scores)
            free(workspace)
            if not optimizer_created and layer % 2 == 0:
                for size in params[layer * 3 : layer * 3 + 3]:
                    alloc(size)  # Adam's two moments, interleaved with activations
                    alloc(size)
        if not optimizer_created:
            for size in params[(layers // 2) * 3 :]:
                alloc(size)
                alloc(size)
            optimizer_created = True
        for old in stragglers:
            free(old)
        stragglers = [activations.pop(rng.randrange(len(activations))) for _ in range(2)]
        loss = alloc(512)
        free(loss)
        grads = []
        pending = list(reversed(activations))
        for layer in reversed(range(layers)):
            grad_act = alloc(width[layer] * b)
            grads.append(alloc(params[layer * 3]))
            if pending:  # frees mostly in reverse order, shuffled within a small window
                window = pending[:3]
                victim = window[rng.randrange(len(window))]
                pending.remove(victim)
                free(victim)
            free(grad_act)
        for rest in pending:
            free(rest)
        rng.shuffle(grads)
        for grad in grads:
            free(grad)
    return events


def trace_summary(events: list[tuple]) -> dict:
    sizes = [e[2] for e in events if e[0] == "a"]
    return {
        "events": len(events),
        "allocations": len(sizes),
        "smallest": min(sizes),
        "largest": max(sizes),
        "requested_bytes": sum(sizes),
    }


def replay(allocator, events: list[tuple], policy: int = 0) -> dict:
    """Run `events`; stop at the first allocation that fails."""
    live: dict[int, tuple[int, int]] = {}  # id -> (offset, requested)
    live_bytes = peak_live = peak_span = 0
    result = {"oom": False}
    for event in events:
        if event[0] == "a":
            _, ident, size = event
            try:
                block = allocator.allocate(size, policy)
            except (NpuMemoryError, MemoryError):
                result.update(oom=True, live_at_oom=live_bytes, failed_request=size)
                break
            live[ident] = (block.offset, size)
            live_bytes += size
            peak_live = max(peak_live, live_bytes)
            peak_span = max(peak_span, block.offset + block.reserved)
        else:
            offset, size = live.pop(event[1])
            allocator.free(offset)
            live_bytes -= size
    result.update(
        peak_live=peak_live,
        peak_span=peak_span,
        span_ratio=peak_span / peak_live if peak_live else 0.0,
    )
    return result


# ---- the baselines ----------------------------------------------------------------------------


class _Block:
    __slots__ = ("offset", "reserved")

    def __init__(self, offset: int, reserved: int):
        self.offset = offset
        self.reserved = reserved


def _acl_size(size: int) -> int:
    return (((size + 31) & -32) + 32 + 63) & -64


class FirstFit:
    """Naive first fit: an address-ordered list of free blocks scanned from the start,
    split on allocate, coalesced on free (like the CANN C-model driver's HBM allocator)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free_list = [[0, capacity]]  # [start, size], address order
        self.live: dict[int, int] = {}

    def allocate(self, size: int, policy: int = 0, owner=None):
        want = _acl_size(size)
        for i, block in enumerate(self.free_list):
            if block[1] >= want:
                offset = block[0]
                if block[1] == want:
                    del self.free_list[i]
                else:
                    block[0] += want
                    block[1] -= want
                self.live[offset] = want
                return _Block(offset, want)
        raise MemoryError(f"first fit: no block of {want} bytes")

    def free(self, offset: int) -> None:
        size = self.live.pop(offset)
        blocks = self.free_list
        lo, hi = 0, len(blocks)
        while lo < hi:  # the insertion point, by address
            mid = (lo + hi) // 2
            if blocks[mid][0] < offset:
                lo = mid + 1
            else:
                hi = mid
        i = lo
        if i < len(blocks) and offset + size == blocks[i][0]:
            blocks[i][0] = offset
            blocks[i][1] += size
        else:
            blocks.insert(i, [offset, size])
        if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == blocks[i][0]:
            blocks[i - 1][1] += blocks[i][1]
            del blocks[i]


class Buddy:
    """Binary buddy allocator: blocks of 2**k bytes (>= 64), split in halves, a freed block
    merged with its buddy (`offset ^ size`) while that is free."""

    MIN_ORDER = 6

    def __init__(self, capacity: int):
        self.top = capacity.bit_length() - 1  # the largest power of two that fits
        self.capacity = 1 << self.top
        self.free_sets: list[set[int]] = [set() for _ in range(self.top + 1)]
        self.free_sets[self.top].add(0)
        self.live: dict[int, int] = {}

    def allocate(self, size: int, policy: int = 0, owner=None):
        want = _acl_size(size)
        order = max(self.MIN_ORDER, (want - 1).bit_length())
        k = order
        while k <= self.top and not self.free_sets[k]:
            k += 1
        if k > self.top:
            raise MemoryError(f"buddy: no block of 2**{order} bytes")
        offset = self.free_sets[k].pop()
        while k > order:  # split, keeping the lower half
            k -= 1
            self.free_sets[k].add(offset + (1 << k))
        self.live[offset] = order
        return _Block(offset, 1 << order)

    def free(self, offset: int) -> None:
        order = self.live.pop(offset)
        while order < self.top:
            buddy = offset ^ (1 << order)
            if buddy not in self.free_sets[order]:
                break
            self.free_sets[order].remove(buddy)
            offset = min(offset, buddy)
            order += 1
        self.free_sets[order].add(offset)
