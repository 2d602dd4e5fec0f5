"""A worker's first write into device memory it has not touched maps the range with one
madvise instead of a fault per page (SpanMemory.prefault, docs/device-memory.md)."""

from __future__ import annotations

import pytest

from simnpu.server.core.unit_protocol import Span
from simnpu.server.units.runner import WorkRunner
from simnpu.server.units.span_memory import PREFAULT_MIN
from simnpu.shm.pages import PageTable
from simnpu.shm.region import Region, segment_name, unlink_quietly

MiB = 1 << 20


@pytest.fixture
def region():
    made = Region.create(segment_name("test-prefault"), 16 * MiB)
    yield made
    made.close()
    unlink_quietly(made.name)


def test_a_worker_maps_a_fresh_range_before_writing_it(region):
    other = Region.attach(region.name)  # the worker's own mapping
    runner = WorkRunner(0, [other.map], [region.name], lambda report: None)
    table = PageTable()
    try:
        base = other.address()
        runner.memory.fill(Span(region.name, 2 * MiB + 100, 0), 7, PREFAULT_MIN)
        assert table.present(base + 2 * MiB)  # the whole range, its first page included
        assert table.present(base + 3 * MiB + 99)
        assert region.map[2 * MiB + 100] == 7 and region.map[2 * MiB + 99] == 0
        runner.memory.copy(Span(region.name, 8 * MiB, 0), Span(region.name, 2 * MiB + 100, 0), 4096)
        assert region.map[8 * MiB] == 7  # small writes just fault
    finally:
        table.close()
        del runner
        other.close()
