"""HCCL collectives on the simulated NPU, as nccl-tests prints them, beside host memcpy.

    python bench/hccl_bench.py [--ranks 2 4] [--ops all_reduce all_gather reduce_scatter]
                               [--min 1KiB] [--max 256MiB] [--factor 4] [--shared-device] [--quick]
                               [--hosts 2 4]

Starts its own daemon (one device per rank unless --shared-device), runs every rank as a
separate process, and prints per collective and rank count a table of size, count, type,
time, algbw and busbw, out of place and in place (the nccl-tests columns and formulas:
busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and reduce_scatter;
size = the bytes of the largest buffer, i.e. per rank for all_reduce, the gathered total
for all_gather, the scattered total for reduce_scatter).

The baselines, measured in the same run (bench/baselines.py): host memcpy bandwidth (numpy
copyto between two warm shared-memory buffers of 64 MiB, best of 5, one process: bytes
copied per second); the two-process copy bandwidth (two processes at once, each copying
64 MiB between its own two warm shared-memory buffers: the bytes read plus the bytes
written per second, of both processes together); and a plain numpy all_reduce of 4 x 64
MiB in one process (sum, then copy to each output).

The floor of a collective is the least memory it must read and write on one shared-memory
host, with every reduction done in cache (n ranks, `size` the nccl-tests size):
  all_reduce      read n inputs, write n outputs:             2 n size (in place too)
  all_gather      read the n chunks once, write each to the n outputs: (n + 1) size;
                  in place each rank's own chunk is already there:     n size
  reduce_scatter  read the n inputs, write the n chunks:      (n + 1) size (in place too)
With the multihost extra, `--hosts 2 4` (the default then) adds all_reduce across hosts'
daemons beside Gloo's own all_reduce (bench/hccl_hosts.py), with the CPU the machine spent
on each and the bound that puts on simnpu / Gloo when the hosts share its CPUs.

For every collective at 64 MiB with the most ranks the summary prints busbw, the floor's
bytes, the floor's bytes per second as a fraction of the two-process copy bandwidth
(target >= 80 %), and the busbw that bandwidth would allow (the ceiling).
Time per collective = wall time of `iters` (at least 10) collectives queued back to back on
the rank's stream, then one synchronize, divided by iters (after 5 warm-up collectives and a
barrier; the slowest rank counts); best of 3 such rounds, as the copy baselines are best of
several.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import baselines  # noqa: E402
import hccl_hosts  # noqa: E402
import numpy as np  # noqa: E402

from simnpu.client import autostart  # noqa: E402
from simnpu.shm.sizes import parse_size  # noqa: E402

FLOOR_FACTOR = {  # (out of place, in place): the floor's bytes over `size`, for n ranks
    "all_reduce": lambda n: (2 * n, 2 * n),
    "all_gather": lambda n: (n + 1, n),
    "reduce_scatter": lambda n: (n + 1, n + 1),
}
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
ITEM = 4  # float32
WARMUP = 5  # collectives before the timed ones, as nccl-tests' default
ROUNDS = 3  # timed rounds: the best counts, as for the copy baselines


class Timing(NamedTuple):
    """One timed round of collectives, per collective: the wall time, and the CPU time
    that the whole machine (every process on it) was busy (baselines.machine_busy_s)."""

    seconds: float
    cpu_s: float


def iterations(size: int, quick: bool) -> int:
    """Enough collectives that each size runs ~0.1-0.3 s, and at least 10."""
    return max(10, min(100 if quick else 200, (32 << 20) // max(size, 1) or 1))


def sizes(low: int, high: int, factor: int) -> list[int]:
    result, size = [], low
    while size <= high:
        result.append(size)
        size *= factor
    return result


def _buffers_and_calls(npu, comm, stream, op, size, n, rank):
    """A rank's buffers for one size of `op`, and its out-of-place and in-place calls."""
    f32, count = np.float32, size // ITEM
    per_rank = count // n  # all_gather's send count, reduce_scatter's recv count
    if op == "all_reduce":
        send, recv = npu.DeviceBuffer(size), npu.DeviceBuffer(size)
        out = (send, recv, "sum")
        inside = (send, send, "sum")
        method, kwargs = comm.all_reduce, {"count": count}
    elif op == "all_gather":
        send, recv = npu.DeviceBuffer(per_rank * ITEM), npu.DeviceBuffer(size)
        out = (send, recv)
        inside = (recv.ptr + rank * per_rank * ITEM, recv)  # send = recv + rank * count
        method, kwargs = comm.all_gather, {"count": per_rank}
    else:
        send, recv = npu.DeviceBuffer(size), npu.DeviceBuffer(per_rank * ITEM)
        out = (send, recv, "sum")
        inside = (send, send.ptr + rank * per_rank * ITEM, "sum")  # recv = send + rank * count
        method, kwargs = comm.reduce_scatter, {"count": per_rank}
    kwargs.update(dtype=f32, stream=stream)
    calls = {"out": lambda: method(*out, **kwargs), "in": lambda: method(*inside, **kwargs)}
    return send, recv, calls


# ---- one rank (a spawned process) ------------------------------------------------------------
def rank_main(rank, n, device, address, plan, quick, root_queue, results) -> None:
    os.environ["SIMNPU_ADDRESS"] = address
    import simnpu.client as npu
    from simnpu.client.collectives import Communicator, get_root_info

    npu.Device(device)
    if rank == 0:
        info = get_root_info()
        for _ in range(n - 1):
            root_queue.put(info)
    else:
        info = root_queue.get()
    comm = Communicator(n, info, rank)
    stream = npu.Stream()
    for op, size in plan:
        send, recv, calls = _buffers_and_calls(npu, comm, stream, op, size, n, rank)
        send.fill(0)
        recv.fill(0)
        iters = iterations(size, quick)
        for mode, call in calls.items():
            for _ in range(WARMUP):  # every AI core taking part has touched the buffers
                call()
            for attempt in range(ROUNDS):
                comm.barrier(stream)
                stream.synchronize()
                start, busy = time.perf_counter(), baselines.machine_busy_s()
                for _ in range(iters):
                    call()
                stream.synchronize()
                seconds = (time.perf_counter() - start) / iters
                cpu = (baselines.machine_busy_s() - busy) / iters
                results.put((op, size, mode, rank, attempt, seconds, cpu))
        send.free()
        recv.free()
    comm.destroy()
    stream.destroy()
    npu.shutdown()


# ---- the baselines, in this process ------------------------------------------------------------
def memcpy_bandwidth(nbytes: int = 64 << 20) -> float:
    return baselines.shm_copy_bandwidth(nbytes)


def two_process_copy_bandwidth(nbytes: int = 64 << 20) -> float:
    return baselines.shm_copy_bandwidth_processes(nbytes, processes=2)


def floor_rows(rows: list[dict], copy2: float, size: int = 64 << 20) -> dict:
    """Print, for each collective at `size` with the most ranks, busbw, the floor's bytes,
    the floor's bytes per second over the two-process copy bandwidth, and the ceiling."""
    n = max(row["ranks"] for row in rows)
    print(
        f"\nfloor (least bytes read + written in memory), {n} ranks, {size >> 20} MiB, beside "
        f"the two-process copy bandwidth ({copy2:.2f} GB/s read + written); target >= 80 %"
    )
    print(
        f"  {'collective':<28} {'busbw':>8} {'floor':>9} {'floor/s':>9} {'of copy':>8} "
        f"{'ceiling':>8}"
    )
    print(f"  {'':<28} {'(GB/s)':>8} {'(MiB)':>9} {'(GB/s)':>9} {'':>8} {'busbw':>8}")
    summary = {}
    for row in rows:
        if row["ranks"] != n or row["size"] != size:
            continue
        op = row["op"]
        for index, (mode, label) in enumerate((("out", "out of place"), ("in", "in place"))):
            floor = FLOOR_FACTOR[op](n)[index] * size
            seconds = row[mode]["time_us"] / 1e6
            rate = floor / seconds / 1e9
            ceiling = size / (floor / copy2 / 1e9) / 1e9 * BUS_FACTOR[op](n)
            row[mode].update(floor_bytes=floor, floor_gbps=rate, of_copy=rate / copy2)
            summary[f"{op} {mode}"] = rate / copy2
            print(
                f"  {op + ' ' + label:<28} {row[mode]['busbw']:>8.2f} {floor >> 20:>9} "
                f"{rate:>9.2f} {rate / copy2:>8.0%} {ceiling:>8.2f}"
                + ("" if rate >= 0.8 * copy2 else "  (target MISSED)")
            )
    return summary


def numpy_all_reduce_busbw(n: int = 4, nbytes: int = 64 << 20) -> float:
    """busbw of the plain numpy way in one process: s = x0 + x1 + ...; copy s to each output."""
    from simnpu.shm.region import Region, segment_name

    region = Region.create(segment_name("hccl-bench"), 2 * n * nbytes)
    try:
        memory = np.frombuffer(region.map, np.float32)
        memory.fill(1)
        count = nbytes // 4
        inputs = [memory[i * count : (i + 1) * count] for i in range(n)]
        outputs = [memory[(n + i) * count : (n + i + 1) * count] for i in range(n)]
        best = min(_numpy_all_reduce(inputs, outputs) for _ in range(3))
        del inputs, outputs, memory
        return nbytes / best / 1e9 * BUS_FACTOR["all_reduce"](n)
    finally:
        region.close()


def _numpy_all_reduce(inputs, outputs) -> float:
    start = time.perf_counter()
    total = inputs[0] + inputs[1]
    for array in inputs[2:]:
        total += array
    for out in outputs:
        np.copyto(out, total)
    return time.perf_counter() - start


# ---- the run -----------------------------------------------------------------------------------
def run_config(addresses, n, devices, ops, size_list, quick) -> dict:
    """Time every op and size with n rank processes; rank r on device devices[r] of the
    daemon at addresses[r]. {(op, size, "out" or "in"): Timing of the best round}."""
    plan = [(op, size) for op in ops for size in size_list]
    spawn = multiprocessing.get_context("spawn")
    root_queue, results = spawn.Queue(), spawn.Queue()
    processes = [
        spawn.Process(
            target=rank_main,
            args=(r, n, devices[r], addresses[r], plan, quick, root_queue, results),
        )
        for r in range(n)
    ]
    for process in processes:
        process.start()
    times: dict = {}
    expected = len(plan) * 2 * n * ROUNDS
    try:
        while len(times) < expected:
            op, size, mode, rank, attempt, seconds, cpu = results.get(timeout=600)
            times[(op, size, mode, rank, attempt)] = Timing(seconds, cpu)
    finally:
        baselines.end_processes(processes)
    table: dict = {}
    for op, size, mode, _, _ in times:
        rounds = [[times[(op, size, mode, r, a)] for r in range(n)] for a in range(ROUNDS)]
        best = min(rounds, key=lambda ranks: max(t.seconds for t in ranks))
        # the slowest rank's time; the machine's CPU as rank 0 saw it over the same window
        table[(op, size, mode)] = Timing(max(t.seconds for t in best), best[0].cpu_s)
    return table


def print_table(op: str, n: int, placement: str, size_list, table) -> list[dict]:
    rows = []
    redop = "sum" if op != "all_gather" else "none"
    print(f"\n# {op}, {n} ranks {placement}, float32" + (", sum" if op != "all_gather" else ""))
    print(
        f"# {'size':>12} {'count':>12} {'type':>6} {'redop':>6} "
        f"|{'out-of-place':^32}|{'in-place':^32}"
    )
    print(
        f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} "
        f"| {'time(us)':>10} {'algbw':>9} {'busbw':>9} "
        f"| {'time(us)':>10} {'algbw':>9} {'busbw':>9}"
    )
    for size in size_list:
        row = {"op": op, "ranks": n, "size": size, "count": size // ITEM}
        cells = []
        for mode in ("out", "in"):
            seconds = table[(op, size, mode)].seconds
            algbw = size / seconds / 1e9
            busbw = algbw * BUS_FACTOR[op](n)
            row[mode] = {"time_us": seconds * 1e6, "algbw": algbw, "busbw": busbw}
            cells.append(f"{seconds * 1e6:>10.1f} {algbw:>9.3f} {busbw:>9.3f}")
        print(f"  {size:>12} {size // ITEM:>12} {'float':>6} {redop:>6} | {cells[0]} | {cells[1]}")
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--ops",
        nargs="+",
        default=["all_reduce", "all_gather", "reduce_scatter"],
        choices=sorted(BUS_FACTOR),
    )
    parser.add_argument("--min", type=parse_size, default=parse_size("1KiB"))
    parser.add_argument("--max", type=parse_size, default=parse_size("256MiB"))
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument(
        "--shared-device", action="store_true", help="every rank on device 0 (simnpu extension)"
    )
    parser.add_argument("--ai-cores", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument(
        "--hosts",
        type=int,
        nargs="*",
        default=[2, 4] if importlib.util.find_spec("torch") else [],
        help="all_reduce across this many hosts' daemons (bench/hccl_hosts.py; default 2 4 "
        "with the multihost extra installed, else none)",
    )
    parser.add_argument("--json", default=os.path.join(HERE, "results", "hccl.json"))
    args = parser.parse_args()
    size_list = sizes(args.min, args.max, args.factor)
    most = max(args.ranks)
    devices = 1 if args.shared_device else most
    per_device = 2 * args.max * (most if args.shared_device else 1) + (16 << 20)
    print(
        f"simnpu HCCL bench: sizes {args.min} .. {args.max} (x{args.factor}), ranks {args.ranks}, "
        f"{devices} device(s) of {per_device >> 20} MiB, {args.ai_cores} AI cores each, "
        f"{len(os.sched_getaffinity(0))} host CPUs"
    )
    memcpy_before = memcpy_bandwidth()
    copy2_before = two_process_copy_bandwidth()
    all_rows = []
    with tempfile.TemporaryDirectory(prefix="simnpu-hccl-bench-") as directory:
        address = f"unix://{directory}/bench.sock"
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "simnpu.server",
                "--listen",
                address,
                "--devices",
                str(devices),
                "--memory",
                f"{per_device >> 20}MiB",
                "--ai-cores",
                str(args.ai_cores),
                "--log-level",
                "WARNING",
            ]
        )
        try:
            deadline = time.monotonic() + 120
            while not autostart.reachable(address):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.05)
            for n in args.ranks:
                placement = "on device 0" if args.shared_device else "on their own devices"
                rank_devices = [0] * n if args.shared_device else list(range(n))
                table = run_config([address] * n, n, rank_devices, args.ops, size_list, args.quick)
                for op in args.ops:
                    all_rows += print_table(op, n, placement, size_list, table)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    host_rows = [hccl_hosts.run_hosts(h, args.quick, run_config) for h in args.hosts]
    if host_rows:
        hccl_hosts.print_rows(host_rows)
    memcpy_after = memcpy_bandwidth()
    copy2_after = two_process_copy_bandwidth()
    naive = numpy_all_reduce_busbw()
    memcpy = max(memcpy_before, memcpy_after)
    print(
        f"\nhost memcpy (numpy copyto shm -> shm, 64 MiB, best of 5): "
        f"{memcpy_before:.2f} GB/s before, "
        f"{memcpy_after:.2f} GB/s after the collectives; baseline = {memcpy:.2f} GB/s"
    )
    print(
        f"plain numpy all_reduce of 4 x 64 MiB in one process (sum, then copy out): "
        f"busbw {naive:.2f} GB/s "
        f"= {naive / memcpy:.0%} of memcpy"
    )
    copy2 = max(copy2_before, copy2_after)
    print(
        f"two-process copy (2 processes at once, numpy copyto shm -> shm, 64 MiB each, read + "
        f"written): {copy2_before:.2f} GB/s before, {copy2_after:.2f} GB/s after; "
        f"baseline = {copy2:.2f} GB/s"
    )
    summary = floor_rows(all_rows, copy2)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "memcpy_gbps": memcpy,
                "numpy_all_reduce_busbw": naive,
                "two_process_copy_gbps": copy2,
                "rows": all_rows,
                "across_hosts": host_rows,
                "target_ratio": summary,
            },
            handle,
            indent=2,
        )
    print(f"JSON in {args.json}")


if __name__ == "__main__":
    main()
