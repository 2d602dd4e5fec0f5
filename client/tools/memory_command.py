"""`simnpu memory stats|snapshot`: look at a running daemon's device memory.

One Query RPC (simnpu.client.tools.query), no session: nothing is allocated, no daemon is
started. Reached through the `simnpu` command (simnpu.cli).
"""

from __future__ import annotations

import argparse
import json
import sys

from simnpu.client.tools.query import ToolError, query


def _bytes(n) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        return f"{n:.4f}" if isinstance(n, float) else str(n)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n}  ({n / (1 << shift):.2f} {unit})"
    return str(n)


def format_stats(stats: dict) -> str:
    width = max(map(len, stats))
    lines = [
        f"{key:<{width}}  {_bytes(value) if 'bytes' in key or key in _BYTE_KEYS else value}"
        for key, value in stats.items()
    ]
    return "\n".join(lines)


_BYTE_KEYS = {"largest_free_block", "capacity", "memory_limit.default"}


def format_snapshot(blocks: list) -> str:
    if not blocks:
        return "no live blocks"
    rows = [("address", "size", "reserved", "huge", "owner", "shared")]
    for b in blocks:
        ipc = b.get("ipc")
        shared = ""
        if ipc:
            shared = f"{ipc['key_count']} key(s), {len(ipc['importers'])} importer(s)"
            if ipc.get("held_after_free"):
                shared += ", freed by owner"
        physical = b.get("physical")
        if physical is not None:  # aclrtMallocPhysical memory: where it is mapped
            at = ", ".join(f"{address:#x}" for address in physical["mapped_at"])
            shared = f"physical, mapped at {at}" if at else "physical, not mapped"
        rows.append(
            (
                f"{b['address']:#x}",
                str(b["size"]),
                str(b["reserved"]),
                "yes" if b["huge"] else "",
                b["owner"],
                shared,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    total = sum(b["reserved"] for b in blocks)
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    out.append(f"{len(blocks)} live blocks, {total} bytes reserved")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="simnpu", description="tools for a running simnpu daemon")
    commands = parser.add_subparsers(dest="command", required=True)
    memory = commands.add_parser("memory", help="device memory of a running daemon")
    views = memory.add_subparsers(dest="view", required=True)
    for name, text in (
        ("stats", "pool statistics (torch.cuda.memory_stats key names)"),
        ("snapshot", "live blocks with owner process and size"),
    ):
        view = views.add_parser(name, help=text)
        view.add_argument("--device", type=int, default=0)
        view.add_argument("--json", action="store_true", help="print JSON")
        view.add_argument(
            "--address", help="the daemon (default: $SIMNPU_ADDRESS or the per-user socket)"
        )
    args = parser.parse_args(argv)
    try:
        answer = query(f"memory_{args.view}", args.device, args.address)
    except ToolError as error:
        print(f"simnpu: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=1))
    else:
        print(format_stats(answer) if args.view == "stats" else format_snapshot(answer))
    return 0
