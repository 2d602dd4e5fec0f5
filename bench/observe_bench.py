"""What tracing and checking cost: the device-throughput probe with each mode off and on.

    python bench/observe_bench.py [--count N] [--rounds R] [--streams S] [--json PATH]

Runs `probes.py device_throughput` (tiny kernels completed per second through `acl`) as
separate client processes against fresh daemons:

  off                 a daemon nobody ever asked to observe (no observer at all)
  trace (client)      SIMNPU_TRACE set in the probe: its session is traced
  off, others traced  an untraced probe on a daemon that traces other clients
  trace (daemon)      `simnpu serve --trace FILE`: every client traced
  memcheck / racecheck / all checks (client)   SIMNPU_CHECK in the probe

Every round runs every mode once (interleaved, so drift on a busy machine hits them alike);
each row is the median of its rounds beside the "off" median of the same run. Besides the
rate, the probe measures the CPU time per task of its timed loop -- the daemon and its
workers from /proc, the client from process_time -- which, unlike the rate, other processes
on the machine do not change (writing the trace file at exit is not counted). The target
(docs/observability.md) is a timeline costing < 10 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import Daemon  # noqa: E402


def probe(daemon: Daemon, streams: int, count: int, env: dict) -> dict:
    """One probe run: its rate, and the CPU the daemon (+ workers) and the client spent per task
    during its timed loop (measured by the probe itself: exporting a trace at exit is not in it)."""
    output = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "probes.py"),
            "device_throughput",
            str(streams),
            str(count),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "SIMNPU_ADDRESS": daemon.address,
            "SIMNPU_AUTOSTART": "0",
            "SIMNPU_BENCH_DAEMON_PID": str(daemon.process.pid),
            **env,
        },
    )
    if output.returncode:
        raise RuntimeError(f"probe failed:\n{output.stderr}")
    result = json.loads(output.stdout.strip().splitlines()[-1])
    return {
        "rate": result["rate"],
        "daemon_us": result["daemon_cpu_ns"] / count / 1000,
        "client_us": result["client_cpu_ns"] / count / 1000,
    }


def run(args) -> list[dict]:
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="simnpu-observe-bench-") as directory:
        trace = os.path.join(directory, "client-%p.json")
        report = os.path.join(directory, "report-%p.txt")
        daemons = {}
        try:
            for name, flags in (
                ("plain", ()),
                ("shared", ()),
                (
                    "traced",
                    ("--trace", os.path.join(directory, "daemon.json"), "--trace-buffer", "200000"),
                ),
            ):
                os.mkdir(os.path.join(directory, name))
                daemons[name] = Daemon(os.path.join(directory, name), "512MiB", *flags)
            modes = [  # (row, daemon, client environment)
                ("off", "plain", {}),
                ("trace (client: SIMNPU_TRACE)", "shared", {"SIMNPU_TRACE": trace}),
                ("off, other clients traced", "shared", {}),
                ("trace (daemon: serve --trace)", "traced", {}),
            ]
            checks = [
                (
                    f"SIMNPU_CHECK={mode}",
                    "shared",
                    {"SIMNPU_CHECK": mode, "SIMNPU_CHECK_REPORT": report},
                )
                for mode in ("memcheck", "racecheck", "all")
            ]
            for number in range(args.rounds):
                for name, daemon, env in modes + (checks if number < args.check_rounds else []):
                    rows.setdefault(name, []).append(
                        probe(daemons[daemon], args.streams, args.count, env)
                    )
        finally:
            for daemon in daemons.values():
                daemon.close()
    return report_table(rows, args)


def report_table(rows: dict, args) -> list[dict]:
    def median(name, key):
        return statistics.median(r[key] for r in rows[name])

    off_rate, off_cpu = (
        median("off", "rate"),
        median("off", "daemon_us") + median("off", "client_us"),
    )
    print(
        f"device throughput (bench/probes.py device_throughput): {args.streams} stream(s), "
        f"{args.count} empty kernels per run, {args.rounds} rounds, modes interleaved; medians"
    )
    print(
        f"  {'mode':<32} {'task/s':>8} {'vs off':>7} {'best':>8} | {'daemon':>7} {'client':>7} "
        f"{'CPU/task':>8} {'vs off':>7}"
    )
    table = []
    for name, runs in rows.items():
        rate, best = median(name, "rate"), max(r["rate"] for r in runs)
        daemon_us, client_us = median(name, "daemon_us"), median(name, "client_us")
        cpu = daemon_us + client_us
        print(
            f"  {name:<32} {rate:>8.0f} {rate / off_rate - 1:>+7.1%} {best:>8.0f} | "
            f"{daemon_us:>5.1f}us {client_us:>5.1f}us {cpu:>6.1f}us {cpu / off_cpu - 1:>+7.1%}"
        )
        table.append(
            {
                "mode": name,
                "rate": rate,
                "best_rate": best,
                "rate_vs_off": rate / off_rate - 1,
                "daemon_cpu_us_per_task": daemon_us,
                "client_cpu_us_per_task": client_us,
                "cpu_vs_off": cpu / off_cpu - 1,
                "runs": runs,
            }
        )
    timeline = [r for r in table if r["mode"].startswith("trace")]
    worst_rate = max(-r["rate_vs_off"] for r in timeline)
    worst_cpu = max(r["cpu_vs_off"] for r in timeline)
    print(
        f"\ntimeline cost, worst of client/daemon tracing: throughput {worst_rate:.1%} lower, CPU "
        f"per task {worst_cpu:+.1%} (target < 10 %: "
        f"{'met' if max(worst_rate, worst_cpu) < 0.10 else 'MISSED'})"
    )
    print(
        "(throughput on a shared 2-core machine is noisy; CPU per task is not slowed by other "
        "processes)"
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument(
        "--check-rounds", type=int, default=2, help="rounds that also run the checkers"
    )
    parser.add_argument("--json", default=os.path.join(HERE, "results", "observe.json"))
    args = parser.parse_args()
    table = run(args)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "count": args.count,
                "streams": args.streams,
                "rows": table,
            },
            handle,
            indent=2,
        )


if __name__ == "__main__":
    main()
