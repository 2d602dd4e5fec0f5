"""A small module load beside clients that flood the module parser.

    python bench/load_flood.py [--loads N] [--flooders F] [--json PATH]

Against a daemon of its own, a victim process loads a tiny kernel module (aclrtBinaryLoad
FromData, `npu.Module.from_source`) N times, 0.3 s apart: first alone, then while F other
processes load 1 MiB modules (the largest a daemon takes by default) in a loop. Prints the
victim's load time, p50 and max, in both cases and their ratio, how many flood loads ended
while a victim load waited (0 when it is served in its turn), and how many flood loads the
flooders got through a second. Both cases run in the same run, on the same daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import Daemon  # noqa: E402

FLOODER = """
import time
import simnpu.client as npu

head = 'from simnpu import kernel\\n\\n@kernel("ptr")\\ndef flood(ctx, p):\\n    pass\\n\\n'
lines, size, i = [], len(head), 0
while True:
    line = f"def helper_{i}(a, b):\\n    return a * {i} + b - {i}\\n\\n"
    if size + len(line) > (1 << 20) - 64:
        break
    lines.append(line)
    size += len(line)
    i += 1
SOURCE = head + "".join(lines)
with npu.Device(0):
    print("ready", flush=True)
    while True:
        npu.Module.from_source(SOURCE, "flood.py")
        print(time.monotonic(), flush=True)
"""

VICTIM = """
import sys
import time
import simnpu.client as npu

SOURCE = 'from simnpu import kernel\\n\\n@kernel("ptr")\\ndef tiny(ctx, p):\\n    pass\\n'
with npu.Device(0):
    for _ in range(int(sys.argv[1])):
        time.sleep(0.3)
        asked = time.monotonic()
        npu.Module.from_source(SOURCE, "tiny.py")
        print(asked, time.monotonic(), flush=True)
"""


def client(address: str, code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": address, "SIMNPU_AUTOSTART": "0"},
    )


def victim(address: str, loads: int) -> list[tuple[float, float]]:
    """(asked, done) of each of the victim's loads, on the system's monotonic clock."""
    process = client(address, VICTIM, str(loads))
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise SystemExit("the victim failed")
    return [(float(a), float(b)) for a, b in (line.split() for line in out.splitlines())]


def flooded(address: str, loads: int, flooders: int) -> tuple[list, list[float]]:
    """The victim's windows beside `flooders` flooding processes, and when each flood load
    ended."""
    floods = [client(address, FLOODER) for _ in range(flooders)]
    try:
        for flood in floods:
            if flood.stdout is None or flood.stdout.readline().strip() != "ready":
                raise SystemExit("a flooder failed")
        for flood in floods:  # each had a load served: the flood is in full swing
            assert flood.stdout is not None
            float(flood.stdout.readline())
        windows = victim(address, loads)
    finally:
        for flood in floods:
            flood.kill()
    ended = []
    for flood in floods:
        out, _ = flood.communicate(timeout=60)
        ended += [float(line) for line in out.split()]
    return windows, ended


def summary(windows: list[tuple[float, float]]) -> dict:
    times = [done - asked for asked, done in windows]
    return {"p50_ms": 1e3 * statistics.median(times), "max_ms": 1e3 * max(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=10, help="the victim's loads per case")
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="simnpu-bench-") as directory:
        daemon = Daemon(directory, "256MiB")
        try:
            alone = summary(victim(daemon.address, args.loads))
            windows, ended = flooded(daemon.address, args.loads, args.flooders)
        finally:
            daemon.close()
    beside = summary(windows)
    during = [sum(asked < t < done for t in ended) for asked, done in windows]
    span = windows[-1][1] - windows[0][0]
    rate = sum(windows[0][0] < t < windows[-1][1] for t in ended) / span
    print(f"A tiny module load, {args.loads} times, alone and beside {args.flooders} processes")
    print("loading 1 MiB modules in a loop (same run, same daemon):\n")
    print("| case | p50 | max |")
    print("|---|---|---|")
    print(f"| alone | {alone['p50_ms']:.0f} ms | {alone['max_ms']:.0f} ms |")
    print(
        f"| beside {args.flooders} flooders | {beside['p50_ms']:.0f} ms "
        f"({beside['p50_ms'] / alone['p50_ms']:.1f}x) | {beside['max_ms']:.0f} ms "
        f"({beside['max_ms'] / alone['max_ms']:.1f}x) |"
    )
    print(
        f"\nflood loads that ended while a victim load waited: {during} "
        f"(mean {statistics.mean(during):.1f})"
    )
    print(f"flood loads completed, all flooders together: {rate:.2f} a second")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "alone": alone,
                    "beside": beside,
                    "flood_loads_during": during,
                    "flood_loads_per_s": rate,
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
