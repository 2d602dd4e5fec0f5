"""What a unit's pipe raises once the daemon is gone: every form is in DAEMON_GONE, so a
unit ends quietly instead of writing a traceback into the daemon's log."""

from __future__ import annotations

import multiprocessing

import pytest

from simnpu.server.core.unit_protocol import DAEMON_GONE


def test_a_daemon_that_closed_its_end_is_end_of_file():
    daemon, unit = multiprocessing.Pipe()
    daemon.close()
    with pytest.raises(DAEMON_GONE):
        unit.recv()
    unit.close()


def test_a_daemon_that_died_with_reports_unread_is_a_reset():
    daemon, unit = multiprocessing.Pipe()
    unit.send("a report the daemon never reads")
    daemon.close()  # as its death closes it, with the report in its queue
    with pytest.raises(ConnectionResetError):
        unit.recv()
    with pytest.raises(DAEMON_GONE):
        unit.recv()
    unit.close()
