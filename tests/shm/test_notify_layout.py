"""The notify area's layout and futex calls, over plain mmaps (no daemon)."""

from __future__ import annotations

import mmap
import multiprocessing
import threading
import time

import pytest

from simnpu.shm import futex
from simnpu.shm import notify as layout
from simnpu.shm.notify import NotifyArea
from simnpu.shm.region import Region, segment_name

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="futexes are not available here")


@pytest.fixture
def area():
    buffer = mmap.mmap(-1, layout.SIZE)
    area = NotifyArea(buffer)
    yield area
    area.release()
    buffer.close()


def test_a_reply_is_found_only_under_its_request_id(area):
    assert area.take_reply(3, 17) is None
    before = area.doorbell()
    assert area.post_reply(3, 17, b"payload")
    assert area.doorbell() == before + 1
    assert area.take_reply(3, 17) == b"payload"
    assert area.take_reply(3, 18) is None
    assert area.take_reply(4, 17) is None


def test_a_reply_too_big_for_its_slot_says_overflow(area):
    assert area.post_reply(0, 5, b"x" * layout.SLOT_CAPACITY)
    assert area.take_reply(0, 5) == b"x" * layout.SLOT_CAPACITY
    assert not area.post_reply(0, 6, b"x" * (layout.SLOT_CAPACITY + 1))
    assert area.take_reply(0, 6) is layout.OVERFLOW


def test_slots_do_not_overlap(area):
    for slot in range(layout.MAILBOX_SLOTS):
        area.post_reply(slot, 100 + slot, bytes([slot]) * layout.SLOT_CAPACITY)
    for slot in range(layout.MAILBOX_SLOTS):
        assert area.take_reply(slot, 100 + slot) == bytes([slot]) * layout.SLOT_CAPACITY
    area.set_done(layout.STREAM_SLOTS - 1, 9, False)
    assert (
        area.take_reply(layout.MAILBOX_SLOTS - 1, 100 + layout.MAILBOX_SLOTS - 1)[-1]
        == layout.MAILBOX_SLOTS - 1
    )


def test_stream_words_carry_the_sequence_number_and_the_dirty_bit(area):
    assert area.word(7) == 0
    area.set_done(7, 12345, False)
    assert area.word(7) == 12345
    area.set_done(7, 12346, True)
    assert area.word(7) & layout.SEQ_MASK == 12346
    assert area.word(7) & layout.DIRTY
    assert area.word(6) == 0 and area.word(8) == 0


def test_a_waiter_sleeps_until_the_word_changes(area):
    def later():
        time.sleep(0.05)
        area.set_done(2, 1, False)

    thread = threading.Thread(target=later)
    start = time.monotonic()
    thread.start()
    while area.word(2) == 0:
        area.wait_word(2, 0, 5.0)
    thread.join()
    assert area.word(2) == 1
    assert time.monotonic() - start < 4.0  # woken, not timed out


def test_a_wait_on_a_word_that_already_moved_returns_at_once(area):
    area.set_done(1, 5, False)
    start = time.monotonic()
    area.wait_word(1, 4, 5.0)
    area.wait_doorbell(area.doorbell() + 1, 5.0)
    assert time.monotonic() - start < 4.0


def test_a_wait_times_out(area):
    start = time.monotonic()
    area.wait_doorbell(area.doorbell(), 0.05)
    assert time.monotonic() - start >= 0.04


def _post_from_another_process(name: str) -> None:
    region = Region.attach(name)
    area = NotifyArea(region.map)
    time.sleep(0.05)
    area.post_reply(1, 42, b"from afar")
    area.set_done(3, 77, False)
    area.release()
    region.close()


def test_futexes_work_across_processes():
    region = Region.create(segment_name("test-notify", time.monotonic_ns()), layout.SIZE)
    area = NotifyArea(region.map)
    try:
        process = multiprocessing.get_context("spawn").Process(
            target=_post_from_another_process, args=(region.name,)
        )
        process.start()
        deadline = time.monotonic() + 30
        while area.word(3) != 77 and time.monotonic() < deadline:
            area.wait_word(3, area.word(3), 1.0)
        process.join(30)
        assert process.exitcode == 0
        assert area.take_reply(1, 42) == b"from afar"
        assert area.word(3) == 77
    finally:
        area.release()
        region.close()
