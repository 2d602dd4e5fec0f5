"""`simnpu trace ...` and `simnpu check ...`: reading timelines and findings.

    simnpu trace summary FILE [--gaps N] [--json]   per-stream busy time, overlap, replays, gaps
    simnpu trace save FILE [--address A]            the daemon's timeline (serve --trace) now
    simnpu check report [--json] [--address A]      the daemon's findings (serve --check) now

`summary` reads any trace simnpu wrote (SIMNPU_TRACE, `serve --trace`, observe.save_trace):
stream tracks are the slices whose category is not "core". A stream is busy while it runs
device work (kernels, copies, memsets, collectives) or a host callback; event records and
waits are not work. Overlap is the time two or more streams were busy at once. Graph
replays (category "replay") are listed per model with the time each took.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import sys

BUSY = ("kernel", "copy", "memset", "collective", "host")


def _union(intervals: list) -> list:
    merged: list = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _length(intervals: list) -> float:
    return sum(end - start for start, end in intervals)


def _at_least(tracks: list, count: int) -> float:
    """Time during which at least `count` of the tracks' (merged) intervals overlap."""
    edges = sorted(
        (t, delta)
        for merged in tracks
        for start, end in merged
        for t, delta in ((start, 1), (end, -1))
    )
    total, active, last = 0.0, 0, None
    for t, delta in edges:
        if active >= count and last is not None:
            total += t - last
        active += delta
        last = t
    return total


def trace_problem(document) -> str | None:
    """Why `document` (parsed JSON) is not a Chrome/Perfetto trace `summarize` can read, or
    None: it must be an object whose "traceEvents" list holds event objects, each slice
    ("X") with a name, pid, ts and dur."""
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return 'it is not a Chrome/Perfetto trace (no "traceEvents" list)'
    for index, event in enumerate(document["traceEvents"]):
        if not isinstance(event, dict):
            return f"traceEvents[{index}] is not an event object"
        if event.get("ph") == "X" and not (
            isinstance(event.get("name"), str)
            and all(isinstance(event.get(key), int | float) for key in ("pid", "ts", "dur"))
        ):
            return f"traceEvents[{index}] is a slice without a name, pid, ts and dur"
    return None


def summarize(trace: dict, gaps: int = 5) -> dict:
    """The numbers `simnpu trace summary` prints (times in microseconds)."""
    processes: dict = {}
    threads: dict = {}
    slices: dict = {}  # (pid, tid) -> list of events
    cores: dict = {}
    for event in trace.get("traceEvents", ()):
        ph = event.get("ph")
        if ph == "M":
            if event.get("name") == "process_name":
                processes[event["pid"]] = event["args"]["name"]
            elif event.get("name") == "thread_name":
                threads[(event["pid"], event["tid"])] = event["args"]["name"]
        elif ph == "X":
            key = (event["pid"], event.get("tid", 0))
            (cores if event.get("cat") == "core" else slices).setdefault(key, []).append(event)
    streams = []
    everything = []
    gap_list = []
    for key, events in slices.items():
        events.sort(key=lambda e: e["ts"])
        busy_events = [e for e in events if e.get("cat") in BUSY]
        waits = [e for e in events if e.get("cat") == "event" and e["name"].startswith("wait")]
        wait_starts = [e["ts"] for e in waits]
        merged = _union([(e["ts"], e["ts"] + e["dur"]) for e in busy_events])
        everything.append(merged)
        name = f"{processes.get(key[0], key[0])} / {threads.get(key, key[1])}"
        counts: dict = {}
        for e in events:
            counts[e.get("cat", "?")] = counts.get(e.get("cat", "?"), 0) + 1
        first = min(e["ts"] for e in events)
        last = max(e["ts"] + e["dur"] for e in events)
        streams.append(
            {
                "stream": name,
                "tasks": len(events),
                "busy_us": _length(merged),
                "active_us": last - first,
                "kinds": counts,
            }
        )
        for before, after in itertools.pairwise(busy_events):
            start, end = before["ts"] + before["dur"], after["ts"]
            if end - start <= 0:
                continue
            during: list = []  # the waits of this stream that overlap the gap (sorted by start)
            index = bisect.bisect_left(wait_starts, end) - 1
            while (
                index >= 0 and waits[index]["ts"] + waits[index]["dur"] > start and len(during) < 3
            ):
                during.append(waits[index])
                index -= 1
            gap_list.append(
                {
                    "gap_us": end - start,
                    "stream": name,
                    "after": _label(before),
                    "before": _label(after),
                    "waiting": [_label(w) for w in reversed(during)],
                }
            )
    busy_any = _union([interval for merged in everything for interval in merged])
    busy_total = _length(busy_any)
    overlap = _at_least(everything, 2)
    span = (busy_any[-1][1] - busy_any[0][0]) if busy_any else 0.0
    core_rows = []
    for key, events in sorted(cores.items()):
        merged = _union([(e["ts"], e["ts"] + e["dur"]) for e in events])
        core_rows.append(
            {
                "track": f"{processes.get(key[0], key[0])} / {threads.get(key, key[1])}",
                "pieces": len(events),
                "busy_us": _length(merged),
            }
        )
    gap_list.sort(key=lambda g: -g["gap_us"])
    return {
        "replays": _replays(slices.values()),
        "title": trace.get("otherData", {}).get("generator", ""),
        "streams": sorted(streams, key=lambda s: s["stream"]),
        "cores": core_rows,
        "span_us": span,
        "busy_any_us": busy_total,
        "overlap_us": overlap,
        "overlap_fraction": overlap / busy_total if busy_total else 0.0,
        "parallelism": sum(s["busy_us"] for s in streams) / busy_total if busy_total else 0.0,
        "longest_gaps": gap_list[:gaps],
        "buffer_overflowed": trace.get("otherData", {}).get("buffer_overflowed", False),
    }


def _replays(tracks) -> list[dict]:
    """Per model replayed (its replay slices, category "replay"): how many replays, of how
    many tasks, and the time each took (from its stream reaching it to its last task's end)."""
    models: dict = {}
    for events in tracks:
        for event in events:
            if event.get("cat") == "replay":
                models.setdefault(event["name"], []).append(event)
    rows = []
    for name, events in sorted(models.items()):
        times = [e["dur"] for e in events]
        rows.append(
            {
                "model": name,
                "replays": len(events),
                "tasks": events[0].get("args", {}).get("tasks", 0),
                "total_us": sum(times),
                "mean_us": sum(times) / len(times),
                "min_us": min(times),
                "max_us": max(times),
            }
        )
    return rows


def _label(event: dict) -> str:
    args = event.get("args", {})
    where = f", {args['site']}" if args.get("site") else ""
    return f"{event['name']} (task {args.get('task', '?')}{where})"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def format_summary(summary: dict, path: str) -> str:
    streams = summary["streams"]
    span = summary["span_us"]
    lines = [
        (
            f"{path}: {summary['title']}, {sum(s['tasks'] for s in streams)} tasks on "
            f"{len(streams)} stream(s), device work spans {_ms(span)} ms"
        )
    ]
    if summary["buffer_overflowed"]:
        lines.append("(the daemon's timeline buffer overflowed: the oldest tasks are missing)")
    width = max([len(s["stream"]) for s in streams] + [6])
    lines.append(f"{'stream':<{width}}  {'tasks':>6}  {'busy ms':>10}  {'busy %':>6}  kinds")
    for s in streams:
        share = s["busy_us"] / span if span else 0.0
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(s["kinds"].items()))
        lines.append(
            f"{s['stream']:<{width}}  {s['tasks']:>6}  {_ms(s['busy_us']):>10}  {share:>6.0%}  "
            f"{kinds}"
        )
    if summary["cores"]:
        lines.append("")
        cwidth = max(len(c["track"]) for c in summary["cores"])
        for c in summary["cores"]:
            share = c["busy_us"] / span if span else 0.0
            lines.append(
                f"{c['track']:<{cwidth}}  {c['pieces']:>6} pieces  {_ms(c['busy_us']):>10} ms "
                f"busy  {share:>4.0%}"
            )
    lines.append("")
    busy = summary["busy_any_us"]
    lines.append(
        f"some stream busy: {_ms(busy)} ms ({busy / span if span else 0:.0%} of the span); "
        f"2+ streams busy at once: {_ms(summary['overlap_us'])} ms "
        f"({summary['overlap_fraction']:.0%} of the busy time)"
    )
    lines.append(
        f"overlap achieved: streams' busy time adds up to {summary['parallelism']:.2f}x the time "
        "anything was busy (1.00x: no overlap)"
    )
    if summary["replays"]:
        lines.append("replays (from its stream reaching a replay to its last task's end):")
        mwidth = max(len(r["model"]) for r in summary["replays"])
        lines.append(
            f"  {'model':<{mwidth}}  {'replays':>7}  {'tasks':>6}  {'mean ms':>10}  "
            f"{'min ms':>10}  {'max ms':>10}"
        )
        for r in summary["replays"]:
            lines.append(
                f"  {r['model']:<{mwidth}}  {r['replays']:>7}  {r['tasks']:>6}  "
                f"{_ms(r['mean_us']):>10}  {_ms(r['min_us']):>10}  {_ms(r['max_us']):>10}"
            )
    if summary["longest_gaps"]:
        lines.append("longest gaps (a stream idle between two of its tasks):")
        for g in summary["longest_gaps"]:
            waiting = f"; waiting: {', '.join(g['waiting'])}" if g["waiting"] else ""
            lines.append(
                f"  {_ms(g['gap_us']):>10} ms  {g['stream']}: after {g['after']}, before "
                f"{g['before']}{waiting}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="simnpu", description="timelines and checker findings")
    commands = parser.add_subparsers(dest="command", required=True)
    trace = commands.add_parser("trace", help="timelines (Chrome/Perfetto trace JSON)")
    views = trace.add_subparsers(dest="view", required=True)
    summary = views.add_parser(
        "summary", help="per-stream busy time, overlap achieved, longest gaps"
    )
    summary.add_argument("file")
    summary.add_argument("--gaps", type=int, default=5, help="how many of the longest gaps to list")
    summary.add_argument("--json", action="store_true")
    save = views.add_parser("save", help="write a running daemon's timeline (simnpu serve --trace)")
    save.add_argument("file")
    save.add_argument("--address")
    check = commands.add_parser("check", help="checker findings")
    check_views = check.add_subparsers(dest="view", required=True)
    report = check_views.add_parser(
        "report", help="a running daemon's findings (simnpu serve --check)"
    )
    report.add_argument("--json", action="store_true")
    report.add_argument("--address")
    args = parser.parse_args(argv)
    if args.command == "trace" and args.view == "summary":
        try:
            with open(args.file, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError) as error:
            print(f"simnpu: cannot read {args.file}: {error}", file=sys.stderr)
            return 1
        problem = trace_problem(document)
        if problem:
            print(
                f"simnpu: {args.file} is not a trace simnpu can summarize: {problem}; simnpu "
                "writes traces with SIMNPU_TRACE=FILE, simnpu serve --trace FILE and "
                "simnpu trace save FILE",
                file=sys.stderr,
            )
            return 1
        result = summarize(document, args.gaps)
        print(json.dumps(result, indent=1) if args.json else format_summary(result, args.file))
        return 0
    from simnpu.client.tools.query import ToolError, query

    try:
        answer = query("trace" if args.command == "trace" else "check_report", 0, args.address)
    except ToolError as error:
        print(f"simnpu: {error}", file=sys.stderr)
        return 1
    if args.command == "trace":
        from simnpu.client.observe import write_json

        write_json(args.file, answer)
        print(f"{args.file}: {answer.get('otherData', {}).get('tasks', 0)} tasks")
    elif args.json:
        print(json.dumps(answer, indent=1))
    else:
        print(answer["text"], end="")
    return 0
