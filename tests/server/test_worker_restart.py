"""ProcessExecutor.restart from another thread than the one that polls the workers' pipes
(a post that met a dead worker): the old pipe is closed by the polling thread, at its next
poll set, and what that thread still reads from it is dropped as a replaced unit's."""

from __future__ import annotations

import os
import signal
import threading
import time

from simnpu.server.core.executor import LOST, Unit, UnitKind
from simnpu.server.core.unit_protocol import Ready
from simnpu.server.memory.device_backing import BackingLog
from simnpu.server.memory.window_table import WindowTable
from simnpu.server.units.process_executor import ProcessExecutor


def _until_ready(executor: ProcessExecutor, unit: Unit) -> list:
    seen: list = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen += executor.wait(0.2)
        if any(u is unit and g == unit.generation and isinstance(r, Ready) for u, g, r in seen):
            return seen
    raise AssertionError(f"the worker never said it was ready: {seen}")


def test_a_restart_beside_the_polling_thread_retires_the_old_pipe(spawn_environment):
    unit = Unit(UnitKind.AI_CORE, 0, 0, 0)
    executor = ProcessExecutor([unit], [], WindowTable(), BackingLog())
    executor.start([unit])
    try:
        _until_ready(executor, unit)
        stale_poll_set = executor._poller  # what the polling thread is inside of
        old = executor._processes[unit]
        os.kill(old.process.pid, signal.SIGKILL)  # its pipe now reads as ended
        old.process.join(10)
        restarter = threading.Thread(target=executor.restart, args=(unit,))
        restarter.start()
        restarter.join(30)
        assert unit.generation == 1
        assert not old.conn.closed, "another thread closed a pipe the poller may be reading"
        executor._poller = stale_poll_set  # the poll that began before the restart ...
        reports = executor.wait(0.5)
        executor._poller = None  # ... and the mark the restart left for the next one
        assert all(g == 0 for u, g, r in reports if r is LOST), (
            "the old pipe's end was reported as the new worker's"
        )
        _until_ready(executor, unit)  # the next poll set: the new pipe only
        assert old.conn.closed
    finally:
        executor.stop()
