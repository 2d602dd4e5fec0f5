"""Every examples/acl_*.py, and the demo, runs as a user runs it (its own process, exit
status 0) and prints what it shows; each checks its own results."""

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


def test_every_lesson_has_its_example():
    assert set(LESSONS) <= {path.name for path in EXAMPLES.glob("acl_*.py")}


@pytest.mark.parametrize("mode", ["shared memory", "in-stream"])
@pytest.mark.parametrize("name", sorted(path.name for path in EXAMPLES.glob("acl_*.py")))
def test_example_runs(daemon, name, mode):
    """In-stream: a client that cannot map the daemon's memory (another container)."""
    env = {**os.environ, "SIMNPU_ADDRESS": daemon.address}
    if mode == "in-stream":
        env["SIMNPU_NO_SHM"] = "1"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=EXAMPLES.parent,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    if name == "acl_sync_pitfall.py" and mode == "in-stream":
        assert (
            "needs pinned memory shared with the daemon" in result.stdout
        )  # says why it cannot run
    else:
        assert LESSONS.get(name, "") in result.stdout


def test_the_demo_runs_and_reports_its_overlap(daemon):
    """The README's first command: results checked against numpy, the measured and the
    expected speed-up of two streams printed."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
        cwd=EXAMPLES.parent,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "all match numpy" in result.stdout
    assert "faster than one stream" in result.stdout
    assert "expected with full overlap" in result.stdout
