"""simnpu's benchmark suite: every figure beside the machine's limit, measured in the same run.

    python bench/run.py [--quick] [--only NAME ...] [--json PATH] [--with-load]
                        [--compare OLD.json [NEW.json]]

Starts its own daemon (and a bare gRPC server for the baselines), runs each probe
(bench/probes.py) as a separate client process, prints one table and writes JSON
(default bench/results/latest.json). Targets are the project's; a row that misses its
target says so — the suite measures, it does not fail. `--with-load` keeps one CPU-bound
process running beside the whole run; `--compare` prints the change per row
(bench/compare.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import baselines  # noqa: E402
import compare  # noqa: E402

from simnpu.client import autostart  # noqa: E402


class Daemon:
    """A daemon of its own for a benchmark run, on a socket in `directory` (or at
    `address`), with more command-line `flags` and environment variables `env`."""

    def __init__(
        self, directory: str, memory: str, *flags: str, address: str = "", env=None
    ) -> None:
        self.address = address or f"unix://{directory}/bench.sock"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "simnpu.server",
                "--listen",
                self.address,
                "--memory",
                memory,
                "--log-level",
                "WARNING",
                *flags,
            ],
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 120
        while not autostart.reachable(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the daemon did not start")
            time.sleep(0.05)

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


def byte_compile_simnpu() -> None:
    """Compile simnpu's client-side modules to bytecode, as `pip install` does for an
    installed package and did for the limit's numpy and grpc: an editable checkout run with
    PYTHONDONTWRITEBYTECODE=1 would otherwise compile them again at every start."""
    import compileall

    import acl
    import simnpu
    import simnpu.client
    import simnpu.proto
    import simnpu.shm

    for package in (simnpu, simnpu.proto, simnpu.shm, simnpu.client, acl):
        compileall.compile_dir(os.path.dirname(package.__file__), quiet=1)


def probe(address: str, name: str, *args, env=None, script: str = "probes.py") -> dict:
    output = subprocess.run(
        [sys.executable, os.path.join(HERE, script), name, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SIMNPU_ADDRESS": address, "SIMNPU_AUTOSTART": "0", **(env or {})},
    )
    if output.returncode:
        raise RuntimeError(f"probe {name} failed:\n{output.stderr}")
    return json.loads(output.stdout.strip().splitlines()[-1])


def probes_at_once(address: str, count: int, name: str, *args) -> list[dict]:
    """Run `count` copies of a probe that says "ready" when set up; tell them all "go" at once."""
    processes = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "probes.py"), name, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "SIMNPU_ADDRESS": address, "SIMNPU_AUTOSTART": "0"},
        )
        for _ in range(count)
    ]
    for process in processes:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"probe {name} did not get ready")
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]


class Table:
    def __init__(self):
        self.rows = []

    def add(self, what, value, unit, limit, limit_what, target, met):
        ratio = value / limit if limit else float("nan")
        self.rows.append(
            {
                "what": what,
                "simnpu": value,
                "unit": unit,
                "limit": limit,
                "limit_what": limit_what,
                "ratio": ratio,
                "target": target,
                "met": bool(met),
            }
        )
        print(
            f"  {what:<52} {value:>11.4g} {unit:<9} | {limit:>11.4g}  {ratio:>6.2f}x  "
            f"{'ok ' if met else 'MISS'} ({target}; limit: {limit_what})",
            flush=True,
        )


class Load:
    """One CPU-bound process for the length of a run, stopped by its PID."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def run(args) -> Table:
    table = Table()
    quick = args.quick
    with tempfile.TemporaryDirectory(prefix="simnpu-bench-") as directory:
        bare = baselines.BareServer(directory)
        daemon = Daemon(directory, "1536MiB")
        address = daemon.address
        selected = lambda name: not args.only or name in args.only  # noqa: E731
        print(f"{'row':<54} {'simnpu':>21} | {'limit':>11}  ratio   target")
        try:
            if selected("launch"):
                count = 20_000 if quick else 100_000
                limit = baselines.packed_sender_rate(bare.address, count)
                figures = probe(address, "launch_rate", count)
                rate = figures["host_rate"]
                table.add(
                    f"async launches via acl, {count} empty kernels",
                    rate,
                    "launch/s",
                    limit,
                    "bare packed-record sender",
                    ">= 500k/s",
                    rate >= 500_000,
                )
                table.add(
                    "async launches via acl: the client's CPU per launch",
                    figures["client_cpu_us"],
                    "us",
                    1e6 / limit,
                    "bare packed-record sender, wall time per record",
                    "(printed)",
                    True,
                )
            if selected("round_trip"):
                figures = probe(address, "round_trip", 1000 if quick else 3000, args.batch)
                table.add(
                    "launch + synchronize, p50",
                    figures["p50"],
                    "us",
                    figures["chain_p50"],
                    "3 chained process wake-ups p50, interleaved",
                    "<= 1.25x chain",
                    figures["p50"] <= 1.25 * figures["chain_p50"],
                )
                table.add(
                    "launch + synchronize, p99",
                    figures["p99"],
                    "us",
                    figures["chain_p99"],
                    "3 chained process wake-ups p99, interleaved",
                    "(printed)",
                    True,
                )
                own = probe(address, "own_round_trip", 1000 if quick else 3000)
                table.add(
                    "own kernel (in the client's kernel process): launch + sync p50",
                    own["p50"],
                    "us",
                    figures["p50"],
                    "built-in kernel, same run",
                    "(printed)",
                    True,
                )
                table.add(
                    "own kernel: first launch + sync (forks its kernel process)",
                    own["first_ms"],
                    "ms",
                    figures["p50"] / 1e3,
                    "built-in kernel launch + sync p50",
                    "(printed)",
                    True,
                )
            if selected("signal_calls"):
                signal_rows(table, address, quick)
            if selected("throughput"):
                one_at_a_time = baselines.pipe_dispatch_rate(10_000, 1)
                runs_of_ten = baselines.pipe_dispatch_rate(50_000, 10)
                for streams in (1, 4):
                    rate = probe(
                        address, "device_throughput", streams, 20_000 if quick else 50_000
                    )["rate"]
                    table.add(
                        f"tiny kernels completed, {streams} stream(s)",
                        rate,
                        "task/s",
                        one_at_a_time,
                        f"pipe dispatch 1 at a time (runs of 10: {runs_of_ten:.3g}/s)",
                        ">= 100k/s",
                        rate >= 100_000,
                    )
            if selected("copies"):
                for nbytes in (64 << 20,) if quick else (64 << 20, 256 << 20):
                    limit = baselines.shm_copy_bandwidth(nbytes)
                    for memory, share in (("pinned", 0.8), ("pageable", 0.45)):
                        figures = probe(address, "copy_bandwidth", nbytes, memory)
                        for direction in ("h2d", "d2h"):
                            value = figures[direction]
                            table.add(
                                f"{direction.upper()} {nbytes >> 20} MiB from {memory} memory",
                                value,
                                "GB/s",
                                limit,
                                "numpy shm->shm copy",
                                f">= {share:.0%}",
                                value >= share * limit,
                            )
                nbytes = 64 << 20
                limit = baselines.stream_bandwidth(bare.address, nbytes)
                figures = probe(
                    address, "copy_bandwidth", nbytes, "pageable", env={"SIMNPU_NO_SHM": "1"}
                )
                assert not figures["shared_memory"]
                for direction in ("h2d", "d2h"):
                    value = figures[direction]
                    table.add(
                        f"{direction.upper()} 64 MiB, client without shared memory",
                        value,
                        "GB/s",
                        limit,
                        "bare gRPC stream of 1 MiB chunks",
                        ">= 70%",
                        value >= 0.7 * limit,
                    )
            if selected("kernels"):
                # the limit comes from the probe: numpy on the very same device buffers, in turn
                # with the launches (the machine's speed drifts by 10-20 % within a minute here)
                for kind, unit, factor in (("add", "GB/s", 1.2), ("exp", "Gelem/s", 1.6)):
                    figures = probe(
                        address,
                        "kernel_rate",
                        kind,
                        1 << 24,
                        env={"SIMNPU_BENCH_DAEMON_PID": str(daemon.process.pid)},
                    )
                    rate, limit = figures["rate"], figures["limit"]
                    table.add(
                        f"{kind} of 16M float32, numBlocks = AI cores",
                        rate,
                        unit,
                        limit,
                        f"np.{kind}(out=), 1 process, same buffers",
                        f">= {factor}x",
                        rate >= factor * limit,
                    )
                    table.add(  # what the machine itself gives two streams at once
                        f"{kind} of 16M float32, one numpy process per AI core at once",
                        figures["processes_at_once"],
                        unit,
                        limit,
                        f"np.{kind}(out=), 1 process, same buffers",
                        "(printed)",
                        True,
                    )
            if selected("pipeline"):
                figures = probe(address, "pipeline", 8 if quick else 12)
                speedup = figures["one_stream_s"] / figures["two_streams_s"]
                table.add(
                    "copy/compute pipeline, 2 streams vs 1",
                    speedup,
                    "x",
                    1.0,
                    "the same work on one stream",
                    ">= 1.5x",
                    speedup >= 1.5,
                )
            if selected("clients"):
                count = 20_000 if quick else 50_000
                alone = probe(address, "launch_rate", count)["completed_rate"]
                together = [
                    r["completed_rate"]
                    for r in probes_at_once(address, 4, "launch_rate", count, "together")
                ]
                aggregate = sum(together)
                spread = max(together) / min(together)
                table.add(
                    "4 clients launching at once, aggregate",
                    aggregate,
                    "launch/s",
                    alone,
                    "one client alone",
                    ">= 1.0x",
                    aggregate >= alone,
                )
                table.add(
                    "4 clients: fastest / slowest client",
                    spread,
                    "x",
                    1.0,
                    "equal shares",
                    "<= 1.2x",
                    spread <= 1.2,
                )
            if selected("facade"):
                figures = probe(address, "facade_overhead", 200_000 if quick else 1_000_000)
                generated, generic = figures["generated_ns"], figures["generic_ns"]
                table.add(
                    "acl facade per launch-shaped call (generated code)",
                    generated,
                    "ns",
                    generic,
                    "a generic wrapper walking the spec",
                    "<= 0.5x",
                    generated <= 0.5 * generic,
                )
            if selected("graphs"):
                graph_rows(table, address, quick)
            if selected("fairness"):
                fairness_rows(table, address, quick)
            if selected("first_call"):
                byte_compile_simnpu()
                limit = baselines.python_startup_ms()
                samples = []
                for _ in range(5):
                    start = time.perf_counter()
                    probe(address, "first_call")
                    samples.append((time.perf_counter() - start) * 1e3)
                value = sorted(samples)[2]
                table.add(
                    "new client process: start to first call done",
                    value,
                    "ms",
                    limit,
                    "python -c 'import numpy, grpc'",
                    "<= limit + 50 ms",
                    value <= limit + 50,
                )
        finally:
            daemon.close()
            bare.close()
    return table


SIGNAL_CALLS = {
    "sync_event": "launch + record + event synchronize",
    "sync_device": "launch + device synchronize",
    "query_stream": "stream query (its work done)",
    "query_event": "event query (its record done)",
}


def signal_rows(table: Table, address: str, quick: bool) -> None:
    """Calls decided on the completion signals, beside launch + synchronize of the same
    run, and the same calls by a request (the path before, and the fallback)."""
    figures = probe(address, "signal_calls", 300 if quick else 1000)
    limit = figures["sync_stream"]["p50"]
    for key, what in SIGNAL_CALLS.items():
        for by_request in (False, True):
            row = figures[f"{key}_request" if by_request else key]
            how = "by request" if by_request else "on signals"
            table.add(
                f"{what}, {how}, p50",
                row["p50"],
                "us",
                limit,
                "launch + synchronize p50, same run",
                "(printed)" if by_request else "<= 1x launch + sync",
                by_request or row["p50"] <= limit,
            )
            table.add(
                f"{what}, {how}, p99",
                row["p99"],
                "us",
                limit,
                "launch + synchronize p50, same run",
                "(printed)",
                True,
            )


def beside(address: str, name: str, *args) -> tuple[dict, dict]:
    """(the victim's figures, the other client's): the victim probe
    (bench/fairness_probes.py) run while the flooder `name` keeps its streams full."""
    other = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "fairness_probes.py"), name, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": address, "SIMNPU_AUTOSTART": "0"},
    )
    try:
        if other.stdout.readline().strip() != "ready":
            raise RuntimeError(f"flooder {name} did not get ready")
        victim = probe(address, "victim", VICTIM_ROUNDS, script="fairness_probes.py")
    finally:
        output = other.communicate(timeout=600)[0]  # (closes its stdin: it stops flooding)
    return victim, json.loads(output.strip().splitlines()[-1])


VICTIM_ROUNDS = 150
VICTIM = f"victim {VICTIM_ROUNDS} x (1,024-element add + sync)"


def fairness_rows(table: Table, address: str, quick: bool) -> None:
    """A victim's small launches beside another client's flood (docs/performance.md, "Fair
    AI cores"): its p50 against its p50 beside two CPU-bound processes, measured first in
    the same run, and its longest launch + synchronize against one of the other client's
    kernels (that kernel's time alone, between two events)."""
    loads = [Load(), Load()]
    try:
        alone = probe(address, "victim", VICTIM_ROUNDS, script="fairness_probes.py")
    finally:
        for load in loads:
            load.close()
    table.add(
        f"{VICTIM}, p50, beside 2 CPU-bound processes",
        alone["p50_ms"],
        "ms",
        alone["p50_ms"],
        "itself (the baseline of the rows below)",
        "(printed)",
        True,
    )
    cases = [  # (the flooder, its arguments, what it does, the p50's target)
        ("flood_adds", (8, 4), "another client's 8 streams of 1M-element adds", 3),
        # (a core freed is refilled before the victim's next launch: it waits most of one)
        ("flood_long", (8, 2, 200), "another client's 8 streams of 200 ms own kernels", None),
    ]
    for name, args, what, factor in cases[:1] if quick else cases:
        victim, other = beside(address, name, *args)
        table.add(
            f"{VICTIM}, p50, beside {what}",
            victim["p50_ms"],
            "ms",
            alone["p50_ms"],
            "its p50 beside 2 CPU-bound processes",
            f"<= {factor}x" if factor else "(printed)",
            not factor or victim["p50_ms"] <= factor * alone["p50_ms"],
        )
        kernel = max(other["kernel_ms"], other["flood_kernel_ms"])
        wait = victim["max_ms"] - alone["p50_ms"]
        table.add(
            f"{VICTIM}, longest less that baseline p50, beside {what}",
            wait,
            "ms",
            kernel,
            f"one of its kernels: {other['kernel_ms']:.3g} ms alone, "
            f"{other['flood_kernel_ms']:.3g} ms per core in the flood "
            f"(victim p99 {victim['p99_ms']:.3g} ms)",
            "<= 1x",
            wait <= kernel,
        )


def graph_rows(table: Table, address: str, quick: bool) -> None:
    """Graph capture and replay (bench/graph_probes.py), each beside its eager version."""
    figures = probe(address, "replay_vs_eager", 1000, 5 if quick else 15, script="graph_probes.py")
    speedup = figures["eager_s"] / figures["replay_s"]
    table.add(
        "1,000 tiny kernels, submit to sync done: replay",
        1000 / figures["replay_s"],
        "task/s",
        1000 / figures["eager_s"],
        f"the same 1,000 eager launches via acl ({speedup:.2f}x)",
        ">= 3x",
        speedup >= 3,
    )
    figures = probe(
        address, "submit_cost", "10,1000,10000", 2 if quick else 5, 21, script="graph_probes.py"
    )
    launch = figures["launch_us"]
    smallest = figures["replay_us"]["10"]
    for size, cost in figures["replay_us"].items():
        table.add(
            f"host CPU per replay, graph of {int(size):,} tasks",
            cost,
            "us",
            launch,
            "host CPU of one eager launch",
            "one call, flat in size",
            cost <= 2 * max(smallest, launch),
        )
    figures = probe(address, "fork_join", 1 << 21 if quick else 1 << 22, script="graph_probes.py")
    eager = figures["serial_s"] / figures["eager_s"]
    replay = figures["serial_s"] / figures["replay_s"]
    table.add(
        "4-stream fork/join replay: overlap (1-stream time / its time)",
        replay,
        "x",
        eager,
        "the same fork/join submitted eagerly",
        ">= 0.9x eager",
        replay >= 0.9 * eager,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sizes")
    parser.add_argument(
        "--only",
        nargs="*",
        help="launch round_trip signal_calls throughput copies kernels pipeline clients facade "
        "graphs first_call fairness",
    )
    parser.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"))
    parser.add_argument(
        "--with-load", action="store_true", help="keep one CPU-bound process running beside"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        help="round_trip: rounds per batch, alternating simnpu and the wake-up chain",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="JSON",
        help="OLD.json: run, then print the change per row; OLD.json NEW.json: compare only",
    )
    args = parser.parse_args()
    if args.compare and len(args.compare) > 2:
        parser.error("--compare takes OLD.json and at most one NEW.json")
    if args.compare and len(args.compare) == 2:
        print("\n".join(compare.report(*map(compare.load, args.compare))))
        return
    old = compare.load(args.compare[0]) if args.compare else None
    load = Load() if args.with_load else None
    try:
        table = run(args)
    finally:
        if load:
            load.close()
    new = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load": args.with_load,
        "rows": table.rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(new, handle, indent=2)
    missed = [r["what"] for r in table.rows if not r["met"]]
    print(
        f"\n{len(table.rows) - len(missed)} of {len(table.rows)} rows meet their target; JSON in "
        f"{args.json}"
    )
    if old:
        print(f"\nchange against {args.compare[0]}:")
        print("\n".join(compare.report(old, new)))


if __name__ == "__main__":
    main()
