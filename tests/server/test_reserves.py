"""server/core/reserves.py: the last of a resource is kept for processes that start."""

from __future__ import annotations

import pytest

from simnpu.server.core.reserves import Reserve, Reserves, parse_reserves


def test_a_process_takes_all_but_the_reserve_then_only_its_start_share():
    reserve = Reserve("streams", "streams", capacity=100, kept=16)
    assert reserve.start == 2
    assert reserve.refuses(held=83, in_use=83) is None  # the 84th: 84 in use, 16 left
    assert "kept for other processes" in reserve.refuses(held=84, in_use=84)
    assert reserve.refuses(held=0, in_use=99) is None  # a process that starts gets one...
    assert reserve.refuses(held=1, in_use=99) is None  # ...and its second
    assert reserve.refuses(held=2, in_use=90) is not None  # not a third
    assert reserve.ceiling(held=0, in_use=0) == 84
    assert reserve.ceiling(held=10, in_use=90) <= 10  # nothing more for it
    assert reserve.ceiling(held=0, in_use=90) == 2


def test_no_reserve_keeps_nothing():
    reserve = Reserve("events", "events", 10, 0)
    assert reserve.refuses(held=9, in_use=9) is None
    assert reserve.ceiling(held=5, in_use=9) == 10


def test_reserve_options_parse():
    chosen = parse_reserves(["memory=25%", "streams=32", "cnt-notifies=0"], 1 << 30)
    assert chosen == Reserves(memory_share=0.25, streams=32, cnt_notifies=0)
    assert parse_reserves(["memory=256MiB"], 1 << 30).memory_share == 0.25
    assert parse_reserves([], 1 << 30) == Reserves()
    assert Reserves().memory(0, 1 << 30).kept == 64 << 20
    for bad in ("memory", "disks=4", "streams=many"):
        with pytest.raises(ValueError, match="--reserve"):
            parse_reserves([bad], 1 << 30)
