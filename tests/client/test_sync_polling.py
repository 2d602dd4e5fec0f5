"""How a synchronize waits on a stream's completion signal (client/runtime/synchronization.py),
and a request on its reply's mailbox slot (client/replies.py): it polls for a while, yielding
the CPU between looks, then sleeps; a stream created with ACL_STREAM_FAST_SYNC polls longer.
One layer faked: the notify area and the connection. The poll windows are patched to "never
ends" or "none", so nothing here depends on how fast the machine runs;
tests/integration/test_fast_path.py runs the real thing."""

from __future__ import annotations

import threading
import time

import pytest

from simnpu.client import fast_path, replies
from simnpu.client.runtime import synchronization
from simnpu.client.runtime.contexts import StreamRecord
from simnpu.proto import codes, npu_pb2
from simnpu.shm.notify import DIRTY, MAILBOX_SLOTS

FOREVER = 3600.0


class Area:
    """A notify area whose word `slot` reaches `done` after `reads` looks, or when a
    synchronize sleeps on it (`wake_on_sleep`)."""

    def __init__(self, done: int, reads: int | None = None, wake_on_sleep: bool = True):
        self.value, self.done, self.reads = 0, done, reads
        self.wake_on_sleep = wake_on_sleep
        self.looks = 0
        self.sleeps: list[float] = []

    def word(self, slot: int) -> int:
        self.looks += 1
        if self.reads is not None and self.looks > self.reads:
            self.value = self.done
        return self.value

    def wait_word(self, slot: int, seen: int, timeout_s: float) -> None:
        self.sleeps.append(timeout_s)
        if self.wake_on_sleep:
            self.value = self.done
        else:
            time.sleep(min(timeout_s, 0.01))


class Log:
    """The call log's accessors a synchronize reads (transport.CallLog's), over plain fields."""

    def __init__(self):
        self.stream_seq: dict[int, int] = {}
        self.deferred_seq = 0

    def last_command(self, stream: int) -> int:
        return self.stream_seq.get(stream, 0)

    def last_deferred(self) -> int:
        return self.deferred_seq

    def covering_command(self, stream: int) -> int:
        seq = self.stream_seq.get(stream, 0)
        return seq if seq == self.deferred_seq else 0


class Connection:
    def __init__(self):
        self.broken: Exception | None = None
        self.log = Log()
        self.doorbells = 0

    def ring_doorbell(self) -> None:
        self.doorbells += 1


def signals_with(
    area: Area, *streams: tuple[int, bool]
) -> tuple[synchronization.StreamSignals, dict[int, StreamRecord]]:
    """Signals of `streams` ((handle, fast_sync) each), the last command 7 on each, and the
    streams' records."""
    connection = Connection()
    records = {}
    for slot, (stream, fast_sync) in enumerate(streams):
        flags = codes.ACL_STREAM_FAST_SYNC if fast_sync else 0
        records[stream] = StreamRecord(stream, None, flags=flags, slot=slot)
        connection.log.stream_seq[stream] = 7
    connection.log.deferred_seq = 7
    return synchronization.StreamSignals(connection, area, records), records


@pytest.fixture
def yields(monkeypatch) -> list[int]:
    count: list[int] = []
    monkeypatch.setattr(synchronization.os, "sched_yield", lambda: count.append(1))
    return count


def test_a_wait_on_short_work_polls_and_never_sleeps(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = Area(done=7, reads=5)
    signals, streams = signals_with(area, (1, False))
    assert signals.synchronize(streams[1], -1) is None  # decided: success
    assert area.sleeps == []
    assert len(yields) == 5  # the first look and the next four saw it running, the 6th done
    assert signals.connection.doorbells == 1
    assert signals.decided == 1


def test_after_the_poll_window_it_sleeps_on_the_signal(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", 0.0)
    area = Area(done=7)
    signals, streams = signals_with(area, (1, False))
    assert signals.synchronize(streams[1], -1) is None
    assert area.sleeps == [fast_path.SLICE_S]
    assert yields == []


def test_a_fast_sync_stream_polls_longer_than_a_plain_one(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", 0.0)
    monkeypatch.setattr(fast_path, "FAST_SYNC_POLL_S", FOREVER)
    area = Area(done=7, reads=3)
    signals, streams = signals_with(area, (1, True), (2, False))
    assert signals.synchronize(streams[1], -1) is None
    assert area.sleeps == [] and yields  # polled until done
    area.value, area.reads, area.looks = 0, None, 0
    assert signals.synchronize(streams[2], -1) is None
    assert len(area.sleeps) == 1  # slept at once
    assert streams[1].fast_sync and not streams[2].fast_sync  # kept by each stream's record


def test_a_timeout_inside_the_poll_window_ends_the_wait(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = Area(done=7, wake_on_sleep=False)  # never done
    signals, streams = signals_with(area, (1, False))
    assert signals.synchronize(streams[1], 20) == 0  # the wait used the timeout up: ask with 0
    assert area.sleeps == [] and yields


def test_a_timeout_after_the_poll_window_sleeps_no_longer_than_it(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", 0.0)
    area = Area(done=7, wake_on_sleep=False)
    signals, streams = signals_with(area, (1, False))
    assert signals.synchronize(streams[1], 30) == 0
    assert area.sleeps and all(0 < slice_s <= 0.03 for slice_s in area.sleeps)


def test_a_broken_session_ends_the_poll(monkeypatch):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = Area(done=7, wake_on_sleep=False)
    signals, streams = signals_with(area, (1, False))
    looks: list[int] = []

    def sched_yield() -> None:
        looks.append(1)
        if len(looks) == 3:
            signals.connection.broken = ConnectionError("gone")

    monkeypatch.setattr(synchronization.os, "sched_yield", sched_yield)
    assert signals.synchronize(streams[1], -1) == -1  # ask the daemon, which raises the error
    assert len(looks) == 3 and area.sleeps == []


def test_an_event_synchronize_stops_polling_once_its_record_is_not_the_last(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = Area(done=7, wake_on_sleep=False)
    signals, streams = signals_with(area, (1, False))
    log = signals.connection.log

    def sched_yield() -> None:
        yields.append(1)
        if len(yields) == 2:
            log.stream_seq[1] = 8  # another thread launched on the stream behind the record

    monkeypatch.setattr(synchronization.os, "sched_yield", sched_yield)
    assert signals.synchronize_event((1, 7), -1) == -1  # the event's record: the daemon decides
    assert len(yields) == 2 and area.sleeps == []


def test_a_dirty_signal_found_while_polling_sends_the_call_to_the_daemon(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = Area(done=7 | DIRTY, reads=2)
    signals, streams = signals_with(area, (1, False))
    assert signals.synchronize(streams[1], -1) == -1
    assert area.sleeps == [] and signals.decided == 0


def test_a_device_synchronize_polls_each_stream_with_its_own_window(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", 0.0)
    monkeypatch.setattr(fast_path, "FAST_SYNC_POLL_S", FOREVER)

    class TwoWords(Area):
        """Slot 0 (the fast-sync stream) is done after 3 looks at it; slot 1 on a sleep."""

        def __init__(self):
            super().__init__(done=7)
            self.values = {0: 0, 1: 0}
            self.looks_at = {0: 0, 1: 0}

        def word(self, slot):
            self.looks_at[slot] += 1
            if slot == 0 and self.looks_at[0] > 3:
                self.values[0] = 7
            return self.values[slot]

        def wait_word(self, slot, seen, timeout_s):
            self.sleeps.append(slot)
            self.values[slot] = 7

    area = TwoWords()
    signals, streams = signals_with(area, (1, True), (2, False))
    assert signals.synchronize_streams([streams[1], streams[2]], -1) is None
    assert area.sleeps == [1]  # only the plain stream's wait slept


class Clock:
    """time.monotonic for the waits, moved by hand."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class SlowArea(Area):
    """Done once a waiter sleeps, `clock` moved on by `sleep_s` meanwhile."""

    def __init__(self, clock: Clock, sleep_s: float):
        super().__init__(done=7)
        self.clock, self.sleep_s = clock, sleep_s

    def wait_word(self, slot: int, seen: int, timeout_s: float) -> None:
        super().wait_word(slot, seen, timeout_s)
        self.clock.now += self.sleep_s


def test_a_stream_whose_last_wait_was_long_sleeps_at_once_until_a_wait_is_short(monkeypatch):
    clock = Clock()
    yields: list[int] = []

    def sched_yield() -> None:  # each look at the signal takes 0.1 ms
        yields.append(1)
        clock.now += 1e-4

    monkeypatch.setattr(synchronization, "time", clock)
    monkeypatch.setattr(synchronization.os, "sched_yield", sched_yield)
    monkeypatch.setattr(fast_path, "POLL_S", 1e-3)
    area = SlowArea(clock, sleep_s=0.05)
    signals, streams = signals_with(area, (1, False))
    area.reads = 3  # 1. short work: done at the 4th look, never slept for
    assert signals.synchronize(streams[1], -1) is None
    assert area.sleeps == [] and len(yields) == 3 and not streams[1].long_wait

    area.value, area.looks, area.reads = 0, 0, None  # 2. work of 50 ms: 10 looks, a sleep
    del yields[:]
    assert signals.synchronize(streams[1], -1) is None
    assert len(yields) == 10 and len(area.sleeps) == 1
    assert streams[1].long_wait

    area.value, area.sleeps, area.sleep_s = 0, [], 1e-4  # 3. after a long wait: no look,
    del yields[:]  # a sleep at once -- 0.1 ms this time
    assert signals.synchronize(streams[1], -1) is None
    assert yields == [] and len(area.sleeps) == 1
    assert not streams[1].long_wait  # a short wait: the next one polls again

    area.value, area.looks, area.reads, area.sleeps = 0, 0, 2, []  # 4. polled for again
    assert signals.synchronize(streams[1], -1) is None
    assert area.sleeps == [] and len(yields) == 2


def test_a_fast_sync_stream_polls_even_after_a_long_wait(monkeypatch, yields):
    clock = Clock()
    monkeypatch.setattr(synchronization, "time", clock)
    monkeypatch.setattr(fast_path, "FAST_SYNC_POLL_S", 1.0)
    area = SlowArea(clock, sleep_s=0.0)
    signals, streams = signals_with(area, (1, True))
    streams[1].long_wait = True
    area.reads = 2
    assert signals.synchronize(streams[1], -1) is None
    assert area.sleeps == [] and len(yields) == 2


# ---- a request's reply in its mailbox slot (client/replies.py) ----------------------------
class MailboxArea:
    """A notify area whose mailbox slot holds the reply after `looks` looks at it, or once
    a waiter sleeps on the doorbell."""

    def __init__(self, payload: bytes, looks: int | None = None):
        self.payload, self.looks = payload, looks
        self.taken = 0
        self.ready = False
        self.sleeps = 0

    def doorbell(self) -> int:
        return 0

    def take_reply(self, slot: int, request_id: int):
        self.taken += 1
        if self.looks is not None and self.taken > self.looks:
            self.ready = True
        return self.payload if self.ready else None

    def wait_doorbell(self, seen: int, timeout_s: float) -> None:
        self.sleeps += 1
        self.ready = True


class Waiting:
    """What a request waiting on its mailbox slot uses: the mailbox, and the connection's
    lock and table of pending replies."""

    def __init__(self, area: MailboxArea):
        self.mailbox = replies.Mailbox(area)
        self.lock = threading.Lock()
        self.replies: dict = {}

    def wait(self, pending: replies.Pending) -> None:
        self.mailbox.wait(pending, self.lock, self.replies)


def reply_to(seq: int) -> bytes:
    return npu_pb2.Reply(id=seq).SerializeToString()


def test_a_reply_that_comes_soon_is_polled_for(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = MailboxArea(reply_to(3), looks=4)
    connection = Waiting(area)
    pending = replies.Pending(3, connection.mailbox.free.pop())
    connection.wait(pending)
    assert pending.event.is_set() and pending.reply.id == 3
    assert area.sleeps == 0 and len(yields) == 4
    assert pending.slot == -1 and len(connection.mailbox.free) == MAILBOX_SLOTS


def test_a_reply_later_than_the_poll_window_is_slept_for(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", 0.0)
    area = MailboxArea(reply_to(3))
    connection = Waiting(area)
    pending = replies.Pending(3, connection.mailbox.free.pop())
    connection.wait(pending)
    assert pending.reply.id == 3
    assert area.sleeps == 1 and yields == []


def test_after_a_long_wait_for_a_reply_the_next_sleeps_at_once(monkeypatch, yields):
    monkeypatch.setattr(fast_path, "POLL_S", FOREVER)
    area = MailboxArea(reply_to(3), looks=2)
    connection = Waiting(area)
    connection.mailbox.long_wait = True
    pending = replies.Pending(3, connection.mailbox.free.pop())
    connection.wait(pending)
    assert area.sleeps == 1 and yields == []  # no poll after a long wait...
    assert connection.mailbox.long_wait is False  # ...and this one was short (< FOREVER)
