"""bench/run.py's launch + synchronize rows, --with-load and --compare at tiny sizes: the
printed structure and the JSON, never the speeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "bench" / "run.py"
CHAIN = "3 chained process wake-ups"


def bench(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def row(what: str, value: float, unit: str, target: str) -> dict:
    return {
        "what": what,
        "simnpu": value,
        "unit": unit,
        "limit": 1.0,
        "limit_what": "an earlier limit",
        "ratio": value,
        "target": target,
        "met": True,
    }


def busy_processes() -> list[str]:
    """Processes running run.py's load (this interpreter, `-c "while True: pass"`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                arguments = handle.read().split(b"\0")[:-1]
        except OSError:
            continue
        if arguments == [sys.executable.encode(), b"-c", b"while True: pass"]:
            found.append(entry)
    return found


def line(output: str, start: str) -> str:
    found = [text.strip() for text in output.splitlines() if text.strip().startswith(start)]
    assert len(found) == 1, output
    return found[0]


@pytest.mark.slow
def test_launch_rows_beside_the_wakeup_chain_under_load_then_compare(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(
        json.dumps(
            {
                "time": "then",
                "load": False,
                "rows": [
                    row("launch + synchronize, p50", 1e-3, "us", "<= 1.5x ping-pong"),
                    row(
                        "own kernel: first launch + sync (forks its kernel process)", 1e9, "ms", ""
                    ),
                    row("a row since removed", 1.0, "launch/s", ">= 1"),
                ],
            }
        )
    )
    output = bench(
        "--quick", "--only", "round_trip", "--batch", "10", "--with-load",
        "--json", str(new), "--compare", str(old),
    )  # fmt: skip

    assert not busy_processes()  # the load was stopped
    table, comparison = output.split(f"change against {old}:")
    rows = {r["what"]: r for r in json.loads(new.read_text())["rows"]}
    assert json.loads(new.read_text())["load"] is True
    for percentile in ("p50", "p99"):
        figures = rows[f"launch + synchronize, {percentile}"]
        assert figures["limit_what"] == f"{CHAIN} {percentile}, interleaved"
        assert figures["simnpu"] > 0 and figures["limit"] > 0
        assert figures["ratio"] == pytest.approx(figures["simnpu"] / figures["limit"])
        assert f"limit: {CHAIN} {percentile}" in line(table, f"launch + synchronize, {percentile}")
    assert rows["launch + synchronize, p50"]["target"] == "<= 1.25x chain"

    assert "old: then, no load; new: " in comparison and "with a CPU-bound process" in comparison
    p50 = line(comparison, "launch + synchronize, p50 (us)")
    assert p50.endswith("worse") and "(other limit)" in p50  # from 0.001 µs, another limit
    first = line(comparison, "own kernel: first launch + sync")
    assert not first.endswith("worse") and "-100.0%" in first  # a time that fell is better
    assert "only in the old run: a row since removed" in comparison
    assert "only in the new run: launch + synchronize, p99" in comparison


def test_compare_two_files_without_a_run(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"rows": [row("rate", 100.0, "task/s", ">= 50")]}))
    new.write_text(json.dumps({"load": True, "rows": [row("rate", 80.0, "task/s", ">= 50")]}))
    output = bench("--compare", str(old), str(new))
    assert line(output, "old: ?, load?; new: ?, with a CPU-bound process")
    rate = line(output, "rate (task/s)").split()
    assert rate[2:6] == ["100", "80", "0.800x", "-20.0%"] and rate[-1] == "worse"


def test_tables_of_several_runs_before_and_after(tmp_path):
    def runs(side: str, figures: list[tuple[float, float]]) -> list[str]:
        paths = []
        for index, (latency, rate) in enumerate(figures):
            path = tmp_path / f"{side}{index}.json"
            rows = [
                row("launch + synchronize, p50", latency, "us", "<= 1.25x chain"),
                row("async launches", rate, "launch/s", ">= 500k/s"),
                row("copy", 5.0 + index, "GB/s", ""),
                row("footprint", 100.0 if side == "before" else 100.5, "MiB", ""),
            ]
            if side == "after":
                rows.append(row("a row only after", 1.0, "us", ""))
            path.write_text(json.dumps({"rows": rows}))
            paths.append(str(path))
        return paths

    before = runs("before", [(400.0, 90e3), (380.0, 95e3), (420.0, 80e3)])
    after = runs("after", [(300.0, 70e3), (310.0, 75e3), (290.0, 85e3)])
    tables = str(RUN.parent / "tables.py")
    done = subprocess.run(
        [sys.executable, tables, "run", "--before", *before, "--after", *after],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    _, figures, ratios = done.stdout.split("| row | before | after | |")  # two tables
    assert line(figures, "| launch + synchronize, p50 (us)") == (
        "| launch + synchronize, p50 (us) | 400 [380–420] | 300 [290–310] | **better** |"
    )
    assert line(figures, "| async launches (launch/s)") == (
        "| async launches (launch/s) | 90k [80k–95k] | 75k [70k–85k] | same |"  # ranges overlap
    )
    assert line(figures, "| copy (GB/s)") == "| copy (GB/s) | 6 [5–7] | 6 [5–7] | same |"
    assert line(figures, "| footprint (MiB)") == (  # apart, but by less than 1 %
        "| footprint (MiB) | 100 [100–100] | 100 [100–100] | same |"
    )
    assert "a row only after" not in figures  # not in every run
    assert line(figures, "3 same") == "3 same, 1 better, 0 worse"
    assert line(ratios, "| launch + synchronize, p50 (ratio to its limit)").endswith("**better** |")


def test_waker_cost_names_both_ways_and_leaves_nothing():
    wakeups = str(RUN.parent / "wakeups.py")
    done = subprocess.run(
        [sys.executable, wakeups, "waker-cost", "50"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert sorted(figures) == ["futex_p50_us", "socket_p50_us"]
    assert all(value > 0 for value in figures.values())
    assert not [name for name in os.listdir("/dev/shm") if "simnpu-bench-sleeper" in name]


def test_launch_path_counts_files_in_every_process_and_leaves_nothing(tmp_path):
    launch_path, figures = str(RUN.parent / "launch_path.py"), tmp_path / "path.json"
    done = subprocess.run(
        [sys.executable, launch_path, "--windows", "3", "--warm-up", "20", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr  # it fails if its daemon left anything behind
    result = json.loads(figures.read_text())
    processes = result["processes"]
    assert list(processes)[:2] == ["client", "daemon"] and len(processes) >= 3  # and a worker
    assert all(files and all(files.values()) for files in processes.values())
    assert 0 < result["count"]["files"] <= result["count"]["functions"]
    assert result["count"]["functions"] <= result["union"]["functions"]
    assert line(done.stdout, "the count (each file and function once):").endswith(
        f"{result['count']['files']} files, {result['count']['functions']} functions"
    )


@pytest.mark.slow
def test_fairness_rows_stop_their_load_and_flooder(tmp_path):
    """The victim's rows beside two CPU-bound processes and beside a flooder
    (bench/fairness_probes.py): each beside its limit, and no process of them left."""
    result = tmp_path / "fair.json"
    bench("--quick", "--only", "fairness", "--json", str(result))
    assert not busy_processes()
    rows = {r["what"]: r for r in json.loads(result.read_text())["rows"]}
    victim = "victim 150 x (1,024-element add + sync)"
    flood = "another client's 8 streams of 1M-element adds"
    baseline = rows[f"{victim}, p50, beside 2 CPU-bound processes"]["simnpu"]
    p50 = rows[f"{victim}, p50, beside {flood}"]
    assert p50["limit"] == baseline > 0 and p50["target"] == "<= 3x"
    longest = rows[f"{victim}, longest less that baseline p50, beside {flood}"]
    assert longest["limit"] > 0 and longest["target"] == "<= 1x"
    assert "one of its kernels" in longest["limit_what"]
    leftovers = [
        entry
        for entry in os.listdir("/proc")
        if entry.isdigit() and b"fairness_probes.py" in _cmdline(entry)
    ]
    assert not leftovers


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
