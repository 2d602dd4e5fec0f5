"""The change per row between two JSON files written by bench/run.py (`--json`).

    python bench/run.py --compare OLD.json            # run, then compare with OLD.json
    python bench/run.py --compare OLD.json NEW.json   # compare two earlier runs, no run

Rows are matched by name. Each row present in both prints old, new, new/old and the change
in percent, and its ratio to the limit measured in the same run, old -> new (the limit moves
with the machine's state, the ratio less). A row that moved the wrong way is marked "worse";
which way is wrong comes from its target ("<=" or ">=") or, for printed rows, its unit (times
lower, everything else higher).
"""

from __future__ import annotations

import json
from typing import Any

TIME_UNITS = {"ns", "us", "ms", "s"}


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def lower_is_better(row: dict[str, Any]) -> bool:
    target = row.get("target", "")
    if target.startswith("<="):
        return True
    if target.startswith(">="):
        return False
    return row["unit"] in TIME_UNITS


def conditions(run: dict[str, Any]) -> str:
    load = {True: "with a CPU-bound process", False: "no load"}.get(run.get("load"), "load?")
    return f"{run.get('time', '?')}, {load}"


def report(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The comparison of run `new` with run `old`, as printed lines."""
    old_rows = {row["what"]: row for row in old["rows"]}
    new_rows = {row["what"]: row for row in new["rows"]}
    lines = [
        f"old: {conditions(old)}; new: {conditions(new)}",
        f"  {'row':<60} {'old':>10} {'new':>10} {'new/old':>8} {'change':>8}  vs limit, old -> new",
    ]
    for what, row in new_rows.items():
        before = old_rows.get(what)
        if before is None:
            continue
        was, now = before["simnpu"], row["simnpu"]
        factor = now / was if was else float("nan")
        worse = now > was if lower_is_better(row) else now < was
        limits = f"{before['ratio']:.3g}x -> {row['ratio']:.3g}x"
        if before.get("limit_what") != row.get("limit_what"):
            limits += " (other limit)"
        lines.append(
            f"  {what + ' (' + row['unit'] + ')':<60} {was:>10.4g} {now:>10.4g} {factor:>7.3f}x "
            f"{(factor - 1) * 100:>+7.1f}%  {limits:<22} {'worse' if worse else ''}".rstrip()
        )
    lines += [f"  only in the old run: {what}" for what in old_rows if what not in new_rows]
    lines += [f"  only in the new run: {what}" for what in new_rows if what not in old_rows]
    return lines
