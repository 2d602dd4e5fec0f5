"""The checkers' pure parts, without a daemon: written-byte sets, what an "rw" view really
wrote, vector clocks, access histories, the report's de-duplication, SIMNPU_CHECK syntax."""

from __future__ import annotations

import numpy as np
import pytest

from simnpu.proto import observe as bits
from simnpu.server.observation import races
from simnpu.server.observation.findings import Findings
from simnpu.server.observation.memcheck import add_range, missing
from simnpu.server.units.access_log import READ, READ_RW, WRITE, _changed, _merge


def test_written_ranges_merge_and_report_what_is_missing():
    written: list = []
    add_range(written, 10, 20)
    add_range(written, 30, 40)
    assert missing(written, 0, 50) == [(0, 10), (20, 30), (40, 50)]
    add_range(written, 20, 30)  # touching on both sides: one range
    assert written == [(10, 40)]
    add_range(written, 5, 12)
    add_range(written, 39, 45)
    assert (
        written == [(5, 45)]
        and missing(written, 5, 45) == []
        and missing(written, 0, 6) == [(0, 5)]
    )


def test_an_rw_view_wrote_exactly_the_elements_whose_bytes_changed():
    before = np.arange(16, dtype=np.float32)
    after = before.copy()
    after[[2, 3, 4, 9]] = -1.0
    assert _changed(before, after) == [(8, 20), (36, 40)]
    assert _changed(before, before.copy()) == []
    nan = np.full(4, np.nan, np.float32)
    assert _changed(nan, nan.copy()) == []  # compared as bits: NaN stays NaN


def test_many_scattered_writes_are_merged_across_the_smallest_gaps():
    before = np.zeros(4096, np.uint8)
    after = before.copy()
    after[::2] = 1  # 2048 separate one-byte runs
    runs = _changed(before, after)
    assert len(runs) <= 256 and runs[0][0] == 0 and runs[-1][1] == 4095


def test_access_entries_of_one_mode_merge_when_they_touch():
    entries = [
        (0, 8, READ, 0, 0),
        (8, 16, READ, 1, 1),
        (0, 8, WRITE, 0, 0),
        (100, 108, READ_RW, 2, 2),
    ]
    assert _merge(entries) == [(0, 16, READ, 0, 1), (0, 8, WRITE, 0, 0), (100, 108, READ_RW, 2, 2)]


class _Stream:
    def __init__(self, session):
        self.context = type("Context", (), {"session": session})()


class _Task:
    def __init__(self, stream, kind="kernel", waits_for=None):
        self.stream, self.kind, self.waits_for, self.probe = stream, kind, waits_for, None

    def follows(self):
        return self.waits_for


class _Probe:
    agent = epoch = 0
    clock = None


def _stamp(clocks, task, session, blocks_host=False):
    task.probe = _Probe()
    clocks.stamp(task, task.probe, session, blocks_host)
    return task.probe


def test_vector_clocks_order_by_stream_event_and_host_synchronisation():
    clocks = races.Clocks()
    session = object()
    s1, s2 = _Stream(session), _Stream(session)
    write = _stamp(clocks, _Task(s1), session)
    read = _stamp(clocks, _Task(s2), session)
    assert not races.ordered_before(write.agent, write.epoch, read.clock)  # two streams: unordered
    later_on_s1 = _stamp(clocks, _Task(s1), session)
    assert races.ordered_before(write.agent, write.epoch, later_on_s1.clock)  # stream order
    record = _Task(s1, "record")
    _stamp(clocks, record, session)
    wait = _stamp(clocks, _Task(s2, "wait", record), session)
    after_wait = _stamp(clocks, _Task(s2), session)
    assert races.ordered_before(later_on_s1.agent, later_on_s1.epoch, after_wait.clock)  # the event
    assert races.ordered_before(wait.agent, wait.epoch, after_wait.clock)
    s3 = _Stream(session)
    before_sync = _stamp(clocks, _Task(s3), session)
    clocks.host_syncs_streams(session, [s2])
    after_sync = _stamp(clocks, _Task(s3), session)
    assert races.ordered_before(read.agent, read.epoch, after_sync.clock)  # host synchronisation
    assert not races.ordered_before(read.agent, read.epoch, before_sync.clock)
    other = object()  # another client: ordered only after what some host synchronised with
    theirs = _stamp(clocks, _Task(_Stream(other)), other)
    assert races.ordered_before(read.agent, read.epoch, theirs.clock)
    assert not races.ordered_before(after_sync.agent, after_sync.epoch, theirs.clock)


def test_the_history_finds_conflicts_and_forgets_what_a_later_write_covers():
    clocks = races.Clocks()
    session = object()
    s1, s2 = _Stream(session), _Stream(session)
    history: list = []
    reader = _stamp(clocks, _Task(s1), session)
    races.remember(
        history,
        races.Access(0, 64, False, reader.agent, reader.epoch, {}, None, session),
        reader.clock,
    )
    other_reader = _stamp(clocks, _Task(s2), session)
    assert races.check(history, 0, 64, False, other_reader) == []  # read-read: no race
    writer = _stamp(clocks, _Task(s2), session)
    [conflict] = races.check(history, 32, 96, True, writer)
    assert conflict.agent == reader.agent
    assert races.check(history, 64, 96, True, writer) == []  # no overlap
    clocks.host_syncs_streams(session, [s1])
    ordered_writer = _stamp(clocks, _Task(s2), session)
    races.remember(
        history,
        races.Access(0, 64, True, ordered_writer.agent, ordered_writer.epoch, {}, None, session),
        ordered_writer.clock,
    )
    assert [a.write for a in history] == [True]  # the read it covers and follows is forgotten


def test_repeated_findings_are_counted_not_repeated():
    findings = Findings()
    first, new = findings.add(("race", "a.py:1", "b.py:2"), lambda: object.__new__(_Count))
    again, new_again = findings.add(("race", "a.py:1", "b.py:2"), lambda: pytest.fail("made twice"))
    assert new and not new_again and first is again and len(findings) == 1


class _Count:
    count = 1


@pytest.mark.parametrize(
    "text, expected",
    [
        ("all", bits.CHECKS),
        ("memcheck,races", bits.MEMCHECK | bits.RACECHECK),
        ("initcheck strict", bits.INITCHECK | bits.RACECHECK | bits.STRICT),
        ("", 0),
        ("off", 0),
    ],
)
def test_check_option_syntax(text, expected):
    assert bits.parse_checks(text) == expected


def test_an_unknown_check_is_refused():
    with pytest.raises(ValueError, match="unknown check 'memchek'"):
        bits.parse_checks("memchek")
