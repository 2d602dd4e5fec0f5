"""Pages of shared memory in this process (simnpu.shm.pages)."""

from __future__ import annotations

import itertools

import pytest

from simnpu.shm.pages import PageTable
from simnpu.shm.region import Region, segment_name, unlink_quietly

_names = itertools.count()
MiB = 1 << 20


@pytest.fixture
def region():
    made = Region.create(segment_name("test-pages", next(_names)), 16 * MiB)
    yield made
    made.close()
    unlink_quietly(made.name)


def test_the_page_table_says_which_pages_this_process_has(region):
    table = PageTable()
    try:
        base = region.address()
        assert not table.present(base + 4 * MiB)
        region.commit(4 * MiB, MiB)
        assert table.present(base + 4 * MiB) and table.present(base + 5 * MiB - 1)
        assert not table.present(base + 5 * MiB)
        region.decommit(4 * MiB, MiB)  # gone from every mapping
        assert not table.present(base + 4 * MiB)
    finally:
        table.close()
