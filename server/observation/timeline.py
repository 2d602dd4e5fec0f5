"""The timeline: every task of the traced sessions, written as a Chrome / Perfetto trace.

Recording appends small tuples of plain values (ints and strings: the garbage collector
stops tracking them, so a full buffer costs no collection time) to one bounded deque,
under the scheduler lock (the "s" records are the observer's, at every submission:
server/observation/observer.py):

  ("s", id(task), stream key, seq, kind, name, n, submit_ns, site)   a task was submitted
  ("r", worker core id, ((id(task), start_ns, end_ns, blocks, code), ...))
                                      a worker's results for traced tasks, one per message
  ("d", id(task), end_ns, label, failure, link)    a control task (record, wait, host
                                      callback, collective) or a failed task completed

A task is named by id(task) only while it is alive, which covers its own records: its
"s" comes before its runs and its "d", and a later task reusing the id has a later "s".
Stream keys are (session, stream handle, device); what they are called is kept once per
stream. Slices, names, tracks and flow arrows are worked out when the trace is asked for.
When the buffer is full the oldest records go (`capacity`, default 500,000 records).

The trace (Chrome JSON object format, opens in ui.perfetto.dev and chrome://tracing):

- one process per client (its pid; name "client <pid> <name>"), one thread per stream:
  a slice (ph "X") per task from when it started (device work: its first block or byte
  started; control tasks: when they reached the head of the stream) to when it finished;
  cat is the task kind (kernel, copy, memset, event, host, collective, replay); a graph
  replay's tasks are on its model's tracks (server/observation/replays.py);
- one process per device, one thread per AI core and copy engine: a slice per piece of
  work a worker ran (cat "core");
- a flow arrow (ph "s" -> "f") from each event record to every stream wait bound to it;
- args on each slice: task number, call site, submit time, queueing delay, failure.

Times are microseconds since the daemon's observer started (CLOCK_MONOTONIC, the clock
of the worker timestamps and of aclrtEventElapsedTime).
"""

from __future__ import annotations

import os
from collections import deque

from simnpu.server.core.tasks.base import size_text

DEFAULT_CAPACITY = 500_000
DEVICE_PID_BASE = 1 << 22  # device "processes" sit above any real pid

_DEVICE_WORK = ("kernel", "copy", "memset")
_CATEGORY = {"record": "event", "wait": "event", "reset": "event"}  # of the other task kinds


class Timeline:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.records: deque = deque(maxlen=capacity)
        self.capacity = capacity
        self.streams: dict = {}  # stream key -> (session id, pid, process name, label)
        self.workers: dict = {}  # core id -> (device, kind, index)

    def __len__(self) -> int:
        return len(self.records)

    def stream_key(self, stream) -> tuple:
        """The key of a stream, its description kept on first sight."""
        owner = stream.owner
        key = (owner.id, stream.handle, stream.device)
        if key not in self.streams:
            self.streams[key] = (owner.id, owner.pid, owner.process_name, stream_label(stream))
        return key

    def ran(self, unit, runs: tuple) -> None:
        if unit.core_id not in self.workers:
            self.workers[unit.core_id] = (unit.device, unit.kind.value, unit.index)
        self.records.append(("r", unit.core_id, runs))

    def done(self, task, end: int) -> None:
        label = task.describe()[0]
        link = None
        record = task.follows()
        if record is not None:
            link = (self.stream_key(record.stream), record.seq)
        failure = task.failure
        failed = (
            f"{failure.code}: {failure.message.splitlines()[0]}" if failure is not None else None
        )
        self.records.append(("d", id(task), end, label, failed, link))

    def forget_session(self, session_id: int) -> None:
        """Drop a session's records (it was traced on its own request and has ended)."""
        kept: deque = deque(maxlen=self.capacity)
        ids: set = set()
        for record in self.records:
            tag = record[0]
            if tag == "s":
                if record[2][0] == session_id:
                    ids.add(record[1])
                    continue
                ids.discard(record[1])
            elif tag == "r":
                runs = tuple(run for run in record[2] if run[0] not in ids)
                if not runs:
                    continue
                record = ("r", record[1], runs)
            elif record[1] in ids:
                continue
            kept.append(record)
        self.records = kept
        self.streams = {k: v for k, v in self.streams.items() if k[0] != session_id}


def chrome_trace(
    timeline: Timeline,
    records: list,
    started_ns: int,
    title: str,
    dropped: bool = False,
    session_id: int | None = None,
) -> dict:
    """The trace of `records` (of one session's tasks if `session_id` is given)."""
    generator = title
    # per traced task:
    # [key, seq, kind, name, n, submit, site, first, last, end, label, failed, link]
    entries: list = []
    live: dict = {}
    runs: list = []
    for record in records:
        tag = record[0]
        if tag == "s":
            _, ident, key, seq, kind, name, n, submit, site = record
            if session_id is not None and key[0] != session_id:
                live.pop(ident, None)
                continue
            entry: list | None = [
                key,
                seq,
                kind,
                name,
                n,
                submit,
                site,
                None,
                None,
                None,
                None,
                None,
                None,
            ]
            live[ident] = entry
            entries.append(entry)
        elif tag == "r":
            core = record[1]
            for ident, start, end, blocks, code in record[2]:
                entry = live.get(ident)
                if entry is None:  # submitted before its session was traced, or another client's
                    continue
                if entry[7] is None or start < entry[7]:
                    entry[7] = start
                if entry[8] is None or end > entry[8]:
                    entry[8] = end
                if code and entry[11] is None:
                    entry[11] = f"{code}"
                runs.append((entry, core, start, end, blocks))
        else:
            entry = live.get(record[1])
            if entry is not None:
                _, _, end, label, failed, link = record
                entry[9], entry[10], entry[12] = end, label, link
                if failed:
                    entry[11] = failed

    def us(ns: int) -> float:  # integer ns / 1000: the shortest repr has at most 3 decimals
        return (ns - started_ns) / 1000

    events: list = []
    named: set = set()

    def process(pid: int, name: str) -> None:
        if pid not in named:
            named.add(pid)
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
            events.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
            )

    def thread(pid: int, tid: int, name: str) -> None:
        if (pid, tid) not in named:
            named.add((pid, tid))
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )

    tracks: dict = {}

    def track_of(key: tuple) -> tuple:
        track = tracks.get(key)
        if track is None:
            sid, pid, process_name, label = timeline.streams.get(
                key, (key[0], 0, "?", f"stream {key[1]}")
            )
            pid = pid or DEVICE_PID_BASE // 2 + sid
            process(pid, f"client {pid} {process_name} (session {sid})")
            tid = key[1] & 0xFFFFFFFF or (1 << 30) + key[2]
            thread(pid, tid, label)
            track = tracks[key] = (pid, tid)
        return track

    slice_at: dict = {}  # (stream key, seq) -> (pid, tid, ts, dur)
    last_end: dict = {}  # stream key -> end of its previous task in the trace
    flows = []
    entries.sort(key=lambda e: (e[0], e[1]))
    for key, seq, kind, name, n, submit, site, first, last, end, label, failed, link in entries:
        if kind in _DEVICE_WORK and first is not None:
            start, end = first, max(last, end or last)
        else:
            end = end if end is not None else last
            if end is None:
                continue  # not finished (or dropped) when the trace was taken
            start = min(max(submit, last_end.get(key, 0)), end)
        last_end[key] = end
        pid, tid = track_of(key)
        args = {
            "task": seq,
            "client": key[0],
            "stream": key[1],
            "submitted_us": us(submit),
            "queued_us": max(0, start - submit) / 1000,
        }
        if site:
            args["site"] = site
        if failed:
            args["failed"] = failed
        slice_name, cat = _title(kind, name, n, label)
        if kind == "kernel":
            args["blocks"] = n
        elif kind in ("copy", "memset"):
            args["bytes"] = n
        elif kind == "replay":
            args["tasks"] = n
        ts, dur = us(start), max(end - start, 1) / 1000
        events.append(
            {
                "name": slice_name,
                "cat": cat,
                "ph": "X",
                "ts": ts,
                "dur": dur,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )
        slice_at[(key, seq)] = (pid, tid, ts, dur)
        if link is not None:
            flows.append((link, (pid, tid, ts, dur)))

    for number, (link, where) in enumerate(flows, 1):
        source = slice_at.get(link)
        if source is None:
            continue
        events.append(
            {
                "ph": "s",
                "id": number,
                "name": "event",
                "cat": "event",
                "pid": source[0],
                "tid": source[1],
                "ts": source[2] + source[3] / 2,
            }
        )
        events.append(
            {
                "ph": "f",
                "bp": "e",
                "id": number,
                "name": "event",
                "cat": "event",
                "pid": where[0],
                "tid": where[1],
                "ts": where[2] + where[3] / 2,
            }
        )

    cores: dict = {}
    for entry, core, start, end, blocks in runs:
        track = cores.get(core)
        if track is None:
            device, kind_of_worker, index = timeline.workers[core]
            pid = DEVICE_PID_BASE + device
            process(pid, f"simnpu device {device}")
            tid = index + 1 if kind_of_worker.startswith("AI") else 1000 + index
            thread(pid, tid, f"{kind_of_worker} {index}")
            track = cores[core] = (pid, tid)
        key, seq, kind, name, n = entry[:5]
        slice_name = _title(kind, name, n, entry[10])[0]
        if kind == "kernel":
            first, stop = blocks if blocks is not None else (0, n)
            slice_name = (
                f"{slice_name} [blocks {first}-{stop - 1}]"
                if stop - first > 1
                else f"{slice_name} [block {first}]"
            )
        events.append(
            {
                "name": slice_name,
                "cat": "core",
                "ph": "X",
                "ts": us(start),
                "dur": max(end - start, 1) / 1000,
                "pid": track[0],
                "tid": track[1],
                "args": {"task": seq, "client": key[0]},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "generator": generator,
            "clock": "CLOCK_MONOTONIC",
            "origin_ns": started_ns,
            "tasks": len(slice_at),
            "buffer_overflowed": dropped,
        },
    }


def _title(kind: str, name, n: int, label) -> tuple[str, str]:
    """(slice name, category) of a task from its "s" record (and "d" label)."""
    if kind == "kernel":
        return name, "kernel"
    if kind == "copy":
        return f"memcpy {name} {size_text(n)}", "copy"  # name: the direction, H2D ...
    if kind == "memset":
        return f"memset {size_text(n)}", "memset"
    return (label or kind), _CATEGORY.get(kind, kind)


def stream_label(stream) -> str:
    if stream.handle == 0:
        return f"synchronous copies (device {stream.device})"
    default = stream.context.streams and stream.context.streams[0] is stream
    return (
        f"stream {stream.handle & 0xFFFFFFFF}{' (default)' if default else ''} device "
        f"{stream.device}"
    )


def write_json(path: str, trace: dict) -> None:
    """Write a trace atomically (a reader never sees half a file)."""
    import json

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(trace, handle, separators=(",", ":"))
    os.replace(temporary, path)
