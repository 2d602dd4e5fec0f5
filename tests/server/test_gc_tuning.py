"""server/units/gc_tuning.py: what the daemon and its workers do to the garbage collector once
started, in a process of its own (the test process's collector stays as it is)."""

from __future__ import annotations

import json
import subprocess
import sys

CHECK = """
import gc, json
from simnpu.server.units import gc_tuning
before = {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}
held = [[n] for n in range(1000)]  # what a started process holds
gc_tuning.settle()
garbage = []
garbage.append(garbage)  # a cycle made after: still collected
del garbage
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "threshold": gc.get_threshold(),
    "collected": gc.collect(),
}))
"""


def test_settle_freezes_what_the_process_holds_and_collects_young_objects_less_often():
    from simnpu.server.units.gc_tuning import YOUNG_THRESHOLD

    result = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["before"]["frozen"] == 0
    assert seen["frozen"] >= 1000  # the held lists and everything imported
    assert seen["threshold"][0] == YOUNG_THRESHOLD > seen["before"]["threshold"][0]
    assert seen["threshold"][1:] == seen["before"]["threshold"][1:]
    assert seen["collected"] >= 1  # cycles made after settling are still collected
