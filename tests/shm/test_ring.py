"""The submission ring over plain mmaps (no daemon): order, wrapping, a full ring, waking."""

from __future__ import annotations

import mmap
import threading
import time

import pytest

from simnpu.proto import commands
from simnpu.shm import futex
from simnpu.shm import ring as layout
from simnpu.shm.ring import RingClosed, RingCorrupt, SubmissionRing

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="futexes are not available here")


@pytest.fixture
def buffer():
    memory = mmap.mmap(-1, layout.SIZE)
    yield memory
    memory.close()


@pytest.fixture
def ends(buffer):
    """(producer, consumer): two views of one ring, as the client and the daemon have."""
    producer, consumer = SubmissionRing(buffer), SubmissionRing(buffer)
    yield producer, consumer
    producer.release()
    consumer.release()


def records(count: int, size: int) -> list[bytes]:
    """Distinct launch records of `size` bytes."""
    args = size - commands.Launch.LAYOUT.size
    return [commands.Launch.pack(1, 2, i, bytes([i % 251]) * args) for i in range(count)]


def decoded(pieces) -> list:
    return [c for piece in pieces for c in commands.decode(piece, ring=True)]


def test_records_come_out_in_order(ends):
    producer, consumer = ends
    assert consumer.take() == []
    written = records(100, 40)
    for record in written:
        producer.put(record)
    assert decoded(consumer.take()) == decoded([b"".join(written)])
    assert consumer.take() == []


@pytest.mark.parametrize("size", [40, 41, 4097, layout.MAX_RECORD])
def test_records_never_straddle_the_end_of_the_data(ends, size):
    producer, consumer = ends
    expected = []
    for round_ in range(3 * layout.CAPACITY // size + 3):  # several laps
        batch = records(3, size)
        for record in batch:
            producer.put(record)
        expected = decoded([b"".join(batch)])
        assert decoded(consumer.take()) == expected, f"round {round_}"


def test_a_full_ring_blocks_the_writer_until_the_reader_takes(ends):
    producer, consumer = ends
    record = records(1, layout.MAX_RECORD)[0]
    for _ in range(layout.CAPACITY // layout.MAX_RECORD):
        producer.put(record)
    done = threading.Event()
    writer = threading.Thread(target=lambda: (producer.put(record), done.set()))
    writer.start()
    assert not done.wait(0.2)
    assert len(decoded(consumer.take())) == layout.CAPACITY // layout.MAX_RECORD
    assert done.wait(10)
    writer.join()
    assert len(decoded(consumer.take())) == 1


def test_a_writer_waiting_for_room_gives_up_when_the_reader_is_gone(buffer):
    gone = threading.Event()
    producer = SubmissionRing(buffer, reader_gone=gone.is_set)
    record = records(1, layout.MAX_RECORD)[0]
    for _ in range(layout.CAPACITY // layout.MAX_RECORD):
        producer.put(record)
    threading.Timer(0.1, gone.set).start()
    with pytest.raises(RingClosed):
        producer.put(record)
    producer.release()


def test_a_sleeping_reader_is_woken_by_a_write(ends):
    producer, consumer = ends
    threading.Timer(0.05, producer.put, (records(1, 40)[0],)).start()
    start = time.monotonic()
    consumer.sleep(5.0)
    assert time.monotonic() - start < 4.0
    assert len(decoded(consumer.take())) == 1


def _napping(buffer) -> bool:
    return int.from_bytes(buffer[128:132], "little") & 1 == 1


def test_the_writer_wakes_a_napping_reader_once_per_nap(buffer, ends, monkeypatch):
    producer, consumer = ends
    wakes = []
    wake = futex.wake
    monkeypatch.setattr(futex, "wake", lambda address: (wakes.append(address), wake(address)))
    for nap in (1, 2):
        napper = threading.Thread(target=consumer.sleep, args=(30.0,))
        napper.start()
        deadline = time.monotonic() + 10
        while not _napping(buffer) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _napping(buffer)
        for record in records(3, 40):  # the first wakes it; the others find it woken
            producer.put(record)
        producer.wake_reader()  # nothing to do: this nap was woken already
        napper.join(10)
        assert not napper.is_alive() and not _napping(buffer)
        assert len(wakes) == nap
        assert len(decoded(consumer.take())) == 3


def test_the_reader_trusts_only_its_own_tail(buffer, ends):
    producer, consumer = ends
    producer.put(records(1, 40)[0])
    buffer[64:72] = (0).to_bytes(8, "little")  # the client scribbles over the tail word
    assert len(decoded(consumer.take())) == 1
    assert consumer.take() == []


def test_a_head_that_makes_no_sense_is_corruption(buffer, ends):
    _, consumer = ends
    buffer[0:8] = (layout.CAPACITY + 1).to_bytes(8, "little")
    with pytest.raises(RingCorrupt):
        consumer.take()
