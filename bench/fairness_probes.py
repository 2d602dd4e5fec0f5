"""The AI cores shared between clients: a victim's small launches beside another client that
floods its streams, each side a pyACL program run as its own process like those of
bench/probes.py (docs/performance.md, "Fair AI cores").

`python bench/fairness_probes.py NAME [ARGS...]` runs one probe against the daemon at
SIMNPU_ADDRESS and prints one JSON object. The flooders say "ready" once their streams are
full, flood until their standard input closes, then print what they launched.
"""

from __future__ import annotations

import collections
import json
import select
import sys
import time

from probes import builtin, check, launch, setup, struct_pack, value

import acl
from simnpu.client.device import runtime

VICTIM_ELEMENTS = 1024
FLOOD_ELEMENTS = 1 << 20


def _buffers(elements: int, count: int = 3) -> list[int]:
    policy = acl.ACL_MEM_MALLOC_HUGE_FIRST
    buffers = [value(acl.rt.malloc(elements * 4, policy)) for _ in range(count)]
    for buffer in buffers:
        check(acl.rt.memset(buffer, elements * 4, 0, elements * 4), "memset")
    return buffers


def victim(rounds: str = "150"):
    """`rounds` x (a 1,024-element add_f32 of one block + synchronize), each timed: p50, p99
    and the longest, in ms."""
    stream = setup()
    add = builtin("add_f32")
    args = struct_pack("<QQQI", *_buffers(VICTIM_ELEMENTS), VICTIM_ELEMENTS)
    for _ in range(20):  # warm-up
        check(launch(add, 1, stream, args), "launch")
        check(acl.rt.synchronize_stream(stream), "synchronize")
    samples = []
    for _ in range(int(rounds)):
        start = time.perf_counter()
        check(launch(add, 1, stream, args), "launch")
        check(acl.rt.synchronize_stream(stream), "synchronize")
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return {
        "p50_ms": samples[len(samples) // 2],
        "p99_ms": samples[int(len(samples) * 0.99)],
        "max_ms": samples[-1],
    }


SLEEPER = """
import time
from simnpu import kernel


@kernel("u32")
def hold(ctx, milliseconds):
    time.sleep(milliseconds / 1000)
"""


def _kernel_ms(func, blocks: int, stream, args: bytes, rounds: int = 10) -> float:
    """How long one launch of `func` takes on the device, alone: the median time between
    events recorded before and after it, in ms."""
    before, after = value(acl.rt.create_event()), value(acl.rt.create_event())
    times = []
    for _ in range(rounds):
        check(acl.rt.record_event(before, stream), "record_event")
        check(launch(func, blocks, stream, args), "launch")
        check(acl.rt.record_event(after, stream), "record_event")
        check(acl.rt.synchronize_event(after), "synchronize_event")
        times.append(value(acl.rt.event_elapsed_time(before, after), "event_elapsed_time"))
    for event in (before, after):
        check(acl.rt.destroy_event(event), "destroy_event")
    return sorted(times)[len(times) // 2]


def _flood(func, blocks: int, args: bytes, streams: int, depth: int, kernel_ms: float):
    """Keep `depth` launches of `func` queued on each of `streams` streams until stdin
    closes: each round launches once per stream and records an event on it, then waits for
    the events of the round `depth` before."""
    handles = [value(acl.rt.create_stream(), "create_stream") for _ in range(streams)]
    free = collections.deque(
        [value(acl.rt.create_event(), "create_event") for _ in handles] for _ in range(depth + 1)
    )
    rounds: collections.deque[list[int]] = collections.deque()
    launched = 0
    said_ready = False
    start = time.perf_counter()
    while True:
        events = free.popleft()
        for stream, event in zip(handles, events):
            check(launch(func, blocks, stream, args), "launch")
            check(acl.rt.record_event(event, stream), "record_event")
        launched += streams
        rounds.append(events)
        if len(rounds) > depth:
            done = rounds.popleft()
            for event in done:
                check(acl.rt.synchronize_event(event), "synchronize_event")
            free.append(done)
        elif len(rounds) == depth and not said_ready:
            print("ready", flush=True)
            said_ready = True
        if said_ready and select.select([sys.stdin], [], [], 0)[0]:
            break
    check(acl.rt.synchronize_device(), "synchronize_device")
    elapsed_ms = (time.perf_counter() - start) * 1e3
    cores = runtime().ai_cores
    return {
        "launched": launched,
        "kernel_ms": kernel_ms,
        # the AI-core time per kernel during the flood (its cores busy with its kernels)
        "flood_kernel_ms": cores * elapsed_ms / launched,
        "blocks": blocks,
    }


def flood_adds(streams: str = "8", depth: str = "4"):
    """Another client flooding `streams` streams with 1M-element add_f32 of numBlocks = AI
    cores, `depth` queued on each; its kernel's own time measured alone first."""
    stream = setup()
    add = builtin("add_f32")
    args = struct_pack("<QQQI", *_buffers(FLOOD_ELEMENTS), FLOOD_ELEMENTS)
    blocks = runtime().ai_cores
    kernel_ms = _kernel_ms(add, blocks, stream, args)
    return _flood(add, blocks, args, int(streams), int(depth), kernel_ms)


def flood_long(streams: str = "8", depth: str = "2", milliseconds: str = "200"):
    """Another client keeping `depth` of its own one-block kernels of `milliseconds` each
    queued on each of `streams` streams (they hold an AI core without using a CPU)."""
    stream = setup()
    binary = value(acl.rt.binary_load_from_data(SLEEPER.encode(), None), "binary_load")
    hold = value(acl.rt.binary_get_function(binary, "hold"), "binary_get_function")
    args = struct_pack("<I", int(milliseconds))
    kernel_ms = _kernel_ms(hold, 1, stream, args, rounds=3)
    return _flood(hold, 1, args, int(streams), int(depth), kernel_ms)


PROBES = {"victim": victim, "flood_adds": flood_adds, "flood_long": flood_long}

if __name__ == "__main__":
    result = PROBES[sys.argv[1]](*sys.argv[2:])
    acl.rt.reset_device(0)
    acl.finalize()
    print(json.dumps(result))
