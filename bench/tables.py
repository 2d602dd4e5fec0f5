"""Before/after tables of several runs of each benchmark script, as in docs/decisions/.

    python bench/tables.py SCRIPT --before A1.json A2.json ... --after B1.json B2.json ...

SCRIPT is the script that wrote the JSON files: run, memory, hccl or observe. Prints a
Markdown table: one line per row of the runs, the median of the runs before and after with
their [min-max], and "better" or "worse" only where the two ranges do not overlap and the
medians differ by more than SAME_WITHIN ("same" otherwise: a figure that hardly varies,
such as a memory footprint, does not change verdict for its last digit). Which way is
better comes from the row's target, else its unit (times and CPU lower; rates, bandwidths
and ratios higher). Rows of `run` also get a table of their
ratio to the limit measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from compare import TIME_UNITS

Row = tuple[str, float, bool]  # name (with its unit), value, lower is better
SAME_WITHIN = 0.01  # medians closer than this (relative) are the same whatever their ranges


def _lower(target: str, unit: str) -> bool:
    if target.startswith("<="):
        return True
    if target.startswith(">="):
        return False
    return unit in TIME_UNITS


def run_rows(data: dict[str, Any]) -> Iterable[Row]:
    """bench/run.py: each row's figure."""
    for row in data["rows"]:
        lower = _lower(row["target"], row["unit"])
        yield f"{row['what']} ({row['unit']})", row["simnpu"], lower


def run_ratio_rows(data: dict[str, Any]) -> Iterable[Row]:
    """bench/run.py: each row's figure over its limit from the same run."""
    for row in data["rows"]:
        if row["limit"]:
            lower = _lower(row["target"], row["unit"])
            yield f"{row['what']} (ratio to its limit)", row["ratio"], lower


def memory_rows(data: dict[str, Any]) -> Iterable[Row]:
    """bench/memory_bench.py: each row's figure."""
    for row in data["rows"]:
        unit = row["unit"] or "share"
        lower = _lower(row["target"], row["unit"]) or unit in ("MiB", "x")
        yield f"{row['what']} ({unit})", row["value"], lower


def hccl_rows(data: dict[str, Any]) -> Iterable[Row]:
    """bench/hccl_bench.py: busbw of each collective, ranks, size and placement; the
    floor's rate over the two-process copy at 64 MiB; the copy itself."""
    for row in data["rows"]:
        size = row["size"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        for mode, place in (("out", "out of place"), ("in", "in place")):
            cell = row[mode]
            yield (
                f"{row['op']}, {row['ranks']} ranks, {label}, {place}: busbw (GB/s)",
                cell["busbw"],
                False,
            )
    for name, share in data.get("target_ratio", {}).items():
        yield f"{name}: floor bytes/s over the two-process copy (share)", share, False
    yield "two-process copy, the limit (GB/s)", data["two_process_copy_gbps"], False


def observe_rows(data: dict[str, Any]) -> Iterable[Row]:
    """bench/observe_bench.py: throughput and CPU per task of each mode."""
    for row in data["rows"]:
        yield f"{row['mode']}: tiny kernels (task/s)", row["rate"], False
        daemon, client = row["daemon_cpu_us_per_task"], row["client_cpu_us_per_task"]
        yield f"{row['mode']}: CPU per task, daemon + client (us)", daemon + client, True


SCRIPTS: dict[str, list[Callable[[dict[str, Any]], Iterable[Row]]]] = {
    "run": [run_rows, run_ratio_rows],
    "memory": [memory_rows],
    "hccl": [hccl_rows],
    "observe": [observe_rows],
}


def _figure(value: float) -> str:
    if value != value:  # nan
        return "-"
    magnitude = abs(value)
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k" if magnitude < 1e6 else f"{value / 1e6:.3g}M"
    return f"{value:.3g}"


def _cell(values: list[float]) -> str:
    return f"{_figure(statistics.median(values))} [{_figure(min(values))}–{_figure(max(values))}]"


def table(
    rows: Callable[[dict[str, Any]], Iterable[Row]],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
) -> list[str]:
    """The Markdown lines of one table: rows present in every run, in the order of the first."""
    figures: dict[str, tuple[list[list[float]], bool]] = {}
    for side, runs in enumerate((before, after)):
        for data in runs:
            for name, value, lower in rows(data):
                figures.setdefault(name, ([[], []], lower))[0][side].append(value)
    lines = ["| row | before | after | |", "|---|---|---|---|"]
    verdicts = {"same": 0, "better": 0, "worse": 0}
    for name, ((old, new), lower) in figures.items():
        if len(old) != len(before) or len(new) != len(after):
            continue  # a row some runs lack (new, or a section not run)
        was, now = statistics.median(old), statistics.median(new)
        if abs(now - was) <= SAME_WITHIN * max(abs(was), abs(now)):
            verdict = "same"
        elif max(old) < min(new):
            verdict = "worse" if lower else "better"
        elif max(new) < min(old):
            verdict = "better" if lower else "worse"
        else:
            verdict = "same"
        verdicts[verdict] += 1
        mark = f"**{verdict}**" if verdict != "same" else verdict
        lines.append(f"| {name} | {_cell(old)} | {_cell(new)} | {mark} |")
    lines.append("")
    lines.append(", ".join(f"{count} {verdict}" for verdict, count in verdicts.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("script", choices=sorted(SCRIPTS))
    parser.add_argument("--before", nargs="+", required=True)
    parser.add_argument("--after", nargs="+", required=True)
    args = parser.parse_args()

    def load(paths: list[str]) -> list[dict[str, Any]]:
        runs = []
        for path in paths:
            with open(path, encoding="utf-8") as handle:
                runs.append(json.load(handle))
        return runs

    before, after = load(args.before), load(args.after)
    for rows in SCRIPTS[args.script]:
        print("\n".join(table(rows, before, after)))
        print()


if __name__ == "__main__":
    main()
