"""FreeSet: the allocator's size-binned free set behaves like one sorted list of keys."""

import bisect
import random

import pytest

from simnpu.shm.freeset import FreeSet, bin_of

SHIFT = 31


def test_bins_are_monotone_in_size():
    sizes = sorted({64 * k for k in range(1, 5000)} | {1 << p for p in range(6, 31)})
    bins = [bin_of(s) for s in sizes]
    assert bins == sorted(bins)
    assert bin_of(64) < bin_of(128) < bin_of(1 << 30)


@pytest.mark.parametrize("seed", [1, 2])
def test_matches_a_sorted_list(seed):
    rng = random.Random(seed)
    fs, model = FreeSet(SHIFT), []
    for _ in range(4000):
        op = rng.random()
        if op < 0.5 or not model:
            size = (
                rng.choice([64, 128, 1 << 20])
                if rng.random() < 0.3
                else 64 * rng.randrange(1, 40000)
            )
            key = size << SHIFT | 64 * rng.randrange(1 << 20)
            if key in model:
                continue
            fs.add(key)
            bisect.insort(model, key)
        elif op < 0.75:
            key = model.pop(rng.randrange(len(model)))
            fs.remove(key)
        else:
            want = (64 * rng.randrange(1, 50000)) << SHIFT
            i = bisect.bisect_left(model, want)
            expected = model.pop(i) if i < len(model) else None
            assert fs.pop_ceil(want) == expected
        assert len(fs) == len(model)
        assert fs.last() == (model[-1] if model else None)
    assert list(fs) == model
    probe = model[len(model) // 3] - 1
    assert list(fs.irange(probe)) == model[bisect.bisect_left(model, probe) :]


def test_empty_and_out_of_range():
    fs = FreeSet(SHIFT)
    assert fs.pop_ceil(64 << SHIFT) is None
    assert fs.last() is None and len(fs) == 0 and list(fs) == []
    fs.add((1 << 30) << SHIFT)
    assert fs.pop_ceil((1 << 33) << SHIFT) is None  # larger than any block can be
    assert list(fs.irange((1 << 33) << SHIFT)) == []
    with pytest.raises(KeyError):
        fs.remove(64 << SHIFT)
    assert fs.pop_ceil(64 << SHIFT) == (1 << 30) << SHIFT
