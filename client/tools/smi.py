"""`simnpu smi`: the `npu-smi info` view of a running daemon.

    simnpu smi [--json] [--watch [SECONDS]] [--count N] [--address ADDR]

Per device: name, health, AI-core utilisation, memory used / total; then the processes
using it (pid, name, memory, streams, live graphs). One Query RPC per sample (tools/query.py); no
session, and no daemon is ever started. AI-core utilisation is measured over an interval:
the tool samples twice (0.2 s apart, or the refresh period with --watch) and divides the
AI-core time completed in between by the interval times the number of cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.metadata import version

from simnpu.client.tools.query import ToolError, daemon_address, query

_SAMPLE_S = 0.2
_WIDTHS = (29, 17, 66)


def utilisation(before: dict, after: dict) -> list[float]:
    """AI-core utilisation (0..1) of each device between two samples."""
    out = []
    for old, new in zip(before["devices"], after["devices"]):
        elapsed = (new["now_ns"] - old["now_ns"]) * max(new["ai_cores"], 1)
        busy = new["ai_core_busy_ns"] - old["ai_core_busy_ns"]
        value = busy / elapsed if elapsed > 0 else 0.0
        if new["ai_cores_running"] and value == 0.0:  # long kernels count when they finish
            value = new["ai_cores_running"] / max(new["ai_cores"], 1)
        out.append(min(max(value, 0.0), 1.0))
    return out


def sample(address: str | None, interval: float, previous: dict | None = None) -> dict:
    """The daemon's view with "ai_core_percent" per device (measured against `previous`,
    or over `interval` seconds)."""
    if previous is None:
        previous = query("devices", 0, address)
        time.sleep(interval)
    current = query("devices", 0, address)
    for device, value in zip(current["devices"], utilisation(previous, current)):
        device["ai_core_percent"] = round(100 * value, 1)
    return current


def _row(cells) -> str:
    return "|" + "|".join(f" {cell:<{width - 1}}" for cell, width in zip(cells, _WIDTHS)) + "|"


def _line(char: str = "-") -> str:
    return "+" + "+".join(char * width for width in _WIDTHS) + "+"


def _mib(n: int) -> int:
    return int(n) >> 20


def render(view: dict, address: str) -> str:
    """The npu-smi style table."""
    inner = sum(_WIDTHS) + len(_WIDTHS) - 1
    title = f" simnpu-smi {version('simnpu')}".ljust(40) + f"Daemon: pid {view['pid']}  {address}"
    out = [_line(), "|" + title.ljust(inner) + "|", _line()]
    out.append(
        _row(("NPU     Name", "Health", "AICore(%)    Memory-Usage(MB)        Streams  Processes"))
    )
    out.append(
        _row(("Chip    Device", "Bus-Id", "AI cores     Copy engines            Worker restarts"))
    )
    out.append(_line("="))
    processes = view["processes"]
    for device in view["devices"]:
        index = device["index"]
        using = [p for p in processes if str(index) in p.get("devices", {})]
        streams = sum(p["devices"][str(index)]["streams"] for p in using)
        memory = f"{_mib(device['memory_used']):<6}/ {_mib(device['memory_total'])}"
        out.append(
            _row(
                (
                    f"{index:<8}{device['name']}",
                    device["health"],
                    f"{device.get('ai_core_percent', 0.0):<13}{memory:<24}{streams:<9}{len(using)}",
                )
            )
        )
        out.append(
            _row(
                (
                    f"{0:<8}{index}",
                    device["bus_id"],
                    f"{device['ai_cores']:<13}{device['copy_engines']:<24}{device['worker_restarts']}",
                )
            )
        )
        out.append(_line("="))
    out.append("")
    out.append(_line())
    out.append(
        _row(
            (
                "NPU     Chip",
                "Process id",
                "Process name             Process memory(MB)   Streams  Graphs",
            )
        )
    )
    out.append(_line("="))
    for device in view["devices"]:
        index = device["index"]
        using = [p for p in processes if str(index) in p.get("devices", {})]
        if not using:
            out.append(_row(("", "", f"No running processes found in NPU {index}")))
        for process in sorted(using, key=lambda p: p["pid"]):
            entry = process["devices"][str(index)]
            name = str(process["name"])[:24]
            out.append(
                _row(
                    (
                        f"{index:<8}0",
                        str(process["pid"]),
                        f"{name:<25}{_mib(entry['memory']):<21}{entry['streams']:<9}"
                        f"{entry.get('graphs', 0)}",
                    )
                )
            )
        out.append(_line("="))
    observe = view.get("observe")
    if observe:
        out.append(
            f"observing: {observe['flags']} for every client; {observe['observed_sessions']} "
            f"observed session(s) now, {observe['trace_records']} timeline records, "
            f"{observe['errors']} error(s) and {observe['warnings']} warning(s) found"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="simnpu smi",
        description="devices, memory, AI-core use and "
        "processes of a running simnpu daemon (like npu-smi info)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2), like watch; Ctrl-C stops",
    )
    parser.add_argument("--count", type=int, help="with --watch: stop after this many refreshes")
    parser.add_argument(
        "--address", help="the daemon (default: $SIMNPU_ADDRESS or the per-user socket)"
    )
    args = parser.parse_args(argv)
    try:
        address = daemon_address(args.address)
        if args.watch is None:
            _print(sample(address, _SAMPLE_S), address, args.json)
            return 0
        previous = None
        shown = 0
        while args.count is None or shown < args.count:
            view = sample(address, min(args.watch, _SAMPLE_S), previous)
            if not args.json and sys.stdout.isatty():
                sys.stdout.write("\033[H\033[2J")
            if not args.json:
                print(
                    f"Every {args.watch:g}s: simnpu smi    "
                    f"{time.strftime('%a %b %d %H:%M:%S %Y')}\n"
                )
            _print(view, address, args.json)
            sys.stdout.flush()
            shown += 1
            previous = view
            if args.count is not None and shown >= args.count:
                break
            time.sleep(args.watch)
    except ToolError as error:
        print(f"simnpu: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _print(view: dict, address: str, as_json: bool) -> None:
    print(json.dumps(view) if as_json else render(view, address))
