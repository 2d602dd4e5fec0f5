"""The exchange between hosts: simnpu's Gloo exchange processes beside Gloo's own all_reduce.

    python bench/exchange_bench.py [--size 64MiB] [--rounds 3] [--iters 10]

Needs the multihost extra (torch's CPU build). Two exchange processes
(server/hccl/gloo_exchange.py), each over its own shared-memory segment as two hosts'
daemons would be, run an all_reduce of `size` bytes of float32 as the daemon will: a
Reduce over ranges cut evenly, then a Gather. The baseline, measured in the same run, is
two plain torch processes running `torch.distributed.all_reduce` over Gloo on a tensor of
the same size. Both talk over loopback. Each round measures both, alternating; a figure
is the p50 of `iters` all-reduces after 3 warm-ups, and the table shows every round.
docs/multihost.md has the figures.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import queue
import secrets
import statistics
import time
from typing import NamedTuple

import baselines

from simnpu.proto import hccl_types as ht
from simnpu.server.hccl.gloo_exchange import ExchangeProcess
from simnpu.server.hccl.gloo_exchange_protocol import (
    ExchangeSetup,
    Formed,
    Gather,
    Reduce,
    StepDone,
    StoreListening,
)
from simnpu.shm.region import Region, segment_name
from simnpu.shm.sizes import parse_size

WARMUP = 3
TIMEOUT_S = 300.0


def exchange_all_reduce_ms(size: int, iters: int) -> float:
    """p50 of `iters` all-reduces between two exchange processes, submit to both done."""
    tag = secrets.token_hex(4)
    regions = [Region.create(segment_name("exchange-bench", tag, h), size) for h in range(2)]
    reports: list[queue.Queue] = [queue.Queue(), queue.Queue()]
    processes: list[ExchangeProcess] = []
    try:
        port = 0
        for h in range(2):
            setup = ExchangeSetup(h, 2, "127.0.0.1", port, regions[h].name, TIMEOUT_S, TIMEOUT_S)
            processes.append(ExchangeProcess(setup, reports[h].put))
            processes[h].start()
            if h == 0:
                listening = reports[0].get(timeout=TIMEOUT_S)
                assert isinstance(listening, StoreListening)
                port = listening.port
        for h in range(2):
            assert isinstance(reports[h].get(timeout=TIMEOUT_S), Formed)
        half = size // 8 * 4  # on a float32 boundary
        owners = (((0, half),), ((half, size),))
        times = []
        for i in range(WARMUP + iters):
            start = time.perf_counter()
            steps = [
                Reduce(2 * i, 0, "float32", ht.HCCL_REDUCE_SUM, owners),
                Gather(2 * i + 1, 0, owners),
            ]
            for process in processes:
                for step in steps:
                    process.submit(step)
            for h in range(2):
                for step in steps:
                    report = reports[h].get(timeout=TIMEOUT_S)
                    assert report == StepDone(step.seq), report
            times.append(time.perf_counter() - start)
        return statistics.median(times[WARMUP:]) * 1e3
    finally:
        for process in processes:
            process.stop()
        for region in regions:
            region.close()


def _gloo_rank(rank: int, n: int, port_queue, size: int, iters: int, results) -> None:
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, n, True, timeout=timeout, wait_for_workers=False)
        for _ in range(n - 1):
            port_queue.put(store.port)
    else:
        port = port_queue.get(timeout=TIMEOUT_S)
        store = dist.TCPStore("127.0.0.1", port, n, False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=timeout)
    tensor = torch.ones(size // 4, dtype=torch.float32)
    times = []
    for i in range(WARMUP + iters):
        if i == WARMUP:
            busy = baselines.machine_busy_s()
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    cpu_ms = (baselines.machine_busy_s() - busy) / iters * 1e3  # the barriers count too
    results.put((rank, (statistics.median(times[WARMUP:]) * 1e3, cpu_ms)))
    dist.destroy_process_group()


class GlooFigures(NamedTuple):
    ms: float  # p50 of one all_reduce, the slowest rank's
    cpu_ms: float  # the CPU the whole machine was busy per all_reduce (rank 0's window)


def gloo_all_reduce(size: int, iters: int, processes: int = 2) -> GlooFigures:
    """Gloo's own all_reduce between plain torch processes on loopback."""
    spawn = multiprocessing.get_context("spawn")
    port_queue, results = spawn.Queue(), spawn.Queue()
    ranks = [
        spawn.Process(target=_gloo_rank, args=(r, processes, port_queue, size, iters, results))
        for r in range(processes)
    ]
    for process in ranks:
        process.start()
    figures = dict(results.get(timeout=TIMEOUT_S) for _ in ranks)
    for process in ranks:
        process.join()
    return GlooFigures(max(ms for ms, _ in figures.values()), figures[0][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=parse_size, default=parse_size("64MiB"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    size = args.size // 8 * 8
    gib = size / (1 << 30)
    print(f"all_reduce of {size >> 20} MiB float32, 2 hosts on loopback (p50 of {args.iters})")
    print(f"{'round':>5}  {'engine ms':>10}  {'GiB/s':>6}  {'Gloo ms':>10}  {'GiB/s':>6}  ratio")
    for round_ in range(1, args.rounds + 1):
        exchange_ms = exchange_all_reduce_ms(size, args.iters)
        gloo_ms = gloo_all_reduce(size, args.iters).ms
        print(
            f"{round_:>5}  {exchange_ms:>10.1f}  {gib / exchange_ms * 1e3:>6.2f}  "
            f"{gloo_ms:>10.1f}  {gib / gloo_ms * 1e3:>6.2f}  {gloo_ms / exchange_ms:.2f}"
        )


if __name__ == "__main__":
    main()
