"""Every examples/acl_*.py runs as a user runs it (its own process, exit status 0) and
prints what it shows; each checks its own results."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
LESSONS = {
    "acl_two_streams.py": "every result matches numpy",
    "acl_event_timing.py": "every product matches numpy",
    "acl_sync_pitfall.py": "only the synchronized read is right",
    "acl_pinned_vs_pageable.py": "the data arrived intact both ways",
    "acl_host_callback.py": "every callback ran in stream order",
}


def test_the_tutorial_lessons_have_examples():
    assert set(LESSONS) <= {path.name for path in EXAMPLES.glob("acl_*.py")}


@pytest.mark.parametrize("name", sorted(path.name for path in EXAMPLES.glob("acl_*.py")))
def test_example_runs(daemon, name):
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], check=False, capture_output=True, text=True,
                            timeout=240, 
                            env={**os.environ, "SIMNPU_ADDRESS": daemon.address}, cwd=EXAMPLES.parent)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    assert LESSONS.get(name, "") in result.stdout
    assert "Traceback" not in result.stderr, result.stderr
