"""What the observer (server/observation/observer.py) does for graph capture and replay
(docs/graph-capture.md, docs/observability.md). All under the scheduler lock.

- A task recorded by a capture of a checked client keeps its call site (`CapturedSite` in
  its probe slot, which its replicas copy): each replica of it is traced and checked with
  the site where it was captured.
- A replay's tasks go on one timeline track per stream of the model ("model 3 stream 0
  (replays)"), whatever private stream each replay made for it, so the replays of a model
  line up under each other; the replay itself is a slice on the replaying stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simnpu.proto.observe import CHECKS
from simnpu.server.observation import races

if TYPE_CHECKING:
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.tasks import Task
    from simnpu.server.observation.observer import Observer


class CapturedSite:
    """The call site of a recorded task, in its probe slot until a replica is observed."""

    __slots__ = ("site",)

    def __init__(self, site: str):
        self.site = site


def site_of(task: Task) -> str:
    """The call site a replica was captured at, "?" for other tasks."""
    probe = task.probe
    return probe.site if probe.__class__ is CapturedSite else "?"  # type: ignore[attr-defined]


def captured(observer: Observer, task: Task) -> None:
    """`task` is being recorded by a capture: a checked client's call site stays with it."""
    watch = observer.watches.get(task.stream.owner)
    if watch is not None and watch.flags & CHECKS:
        site = watch.sites.pop(task.seq, None)
        if site is not None:
            task.probe = CapturedSite(site)


def replaying(
    observer: Observer, replaying: Stream, model: int, lanes: Sequence[tuple[int, Stream]]
) -> None:
    """A replay of model `model` on `replaying` queues its tasks now (each lane's, by its
    handle, on its private stream): a traced client sees them on its model's tracks."""
    owner = replaying.owner
    watch = observer.watches.get(owner)
    if watch is None:
        return
    streams = observer.timeline.streams
    for index, (lane, stream) in enumerate(lanes):
        key = (owner.id, lane, stream.device)
        if key not in streams:
            label = f"model {model} stream {index} (replays) device {stream.device}"
            streams[key] = (owner.id, owner.pid, owner.process_name, label)
        watch.keys[stream] = key


def joined(observer: Observer, into: Stream, streams: Sequence[Stream]) -> None:
    """`into` goes on only once `streams` have drained (the private streams of a replay,
    or of a sub model a cond task ran): for the checkers, its latest task comes after
    theirs, so a host that synchronized `into` has seen them finish."""
    watch = observer.watches.get(into.owner)
    if watch is None or not watch.flags & CHECKS:
        return
    clocks = observer.clocks.streams
    entry = clocks.get(into)
    if entry is None:
        return
    clock = dict(entry[1])  # (a tail clock is also its task's: replaced, not edited)
    for stream in streams:
        other = clocks.get(stream)
        if other is not None:
            races.join(clock, other[1])
    entry[1] = clock


def replayed(observer: Observer, into: Stream, streams: Sequence[Stream]) -> None:
    """A replay on `into` is over: its stream comes after its private streams `streams`,
    which are forgotten."""
    joined(observer, into, streams)
    watch = observer.watches.get(into.owner)
    if watch is not None:
        for stream in streams:
            watch.keys.pop(stream, None)
