"""Runs a program of examples/cann/ as a user runs it: its own process against a test
daemon, exit status 0, no traceback. Tests then check what it printed."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

CANN_EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cann"


def run_cann_example(
    address: str, program: str, *args: str, env: dict[str, str] | None = None
) -> str:
    """Run examples/cann/<program> with the daemon at `address`; return its stdout."""
    result = subprocess.run(
        [sys.executable, str(CANN_EXAMPLES / program), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "SIMNPU_ADDRESS": address, **(env or {})},
        cwd=CANN_EXAMPLES,
    )
    output = f"{program}:\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, output
    assert "Traceback" not in result.stderr, output
    return result.stdout
