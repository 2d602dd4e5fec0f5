"""pyACL programs run unchanged against a real daemon; their own checks are the assertions
(exit status 0, "run success", no "failed ret" line, the data they print).

- samples/*.py: programs written for these tests against the pyACL documentation, in the
  style of the public samples (bare numbers for constants, check_ret after every call).
- The public Ascend/samples pyACL programs that need no model or DVPP processing run too
  when SIMNPU_PYACL_SAMPLES names a checkout of github.com/Ascend/samples (they are not
  copied into this repository); samples/README.md lists them and how they were verified.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

SAMPLES = pathlib.Path(__file__).resolve().parent / "samples"
_MEMORY = "python/level1_single_api/1_acl/2_memory_management"
PUBLIC = {  # path in Ascend/samples -> (arguments from its README, what it prints when right)
    f"{_MEMORY}/memcpy_host_device_python/src/memcpy_host_device.py": (
        ["--release_cycle", "2", "--number_of_cycles", "2", "--write_back_host"],
        "Write back host data is [7 7 7",
    ),
    f"{_MEMORY}/memcpy_host_device_async_python/src/memcpy_host_device_async_python.py": (
        [],
        "run success!",
    ),
    f"{_MEMORY}/memcpy_host_DVPP_python/src/memcpy_host_dvpp.py": (
        ["--release_cycle", "2"],
        "run success!",
    ),
}


def run(daemon, path: pathlib.Path, arguments=()):
    return subprocess.run(
        [sys.executable, str(path), *arguments],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path.parent,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )


@pytest.mark.parametrize("name", sorted(path.name for path in SAMPLES.glob("*.py")))
def test_sample_runs_unchanged(daemon, name):
    result = run(daemon, SAMPLES / name)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "run success" in result.stdout, output
    assert "failed" not in output, output


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("SIMNPU_PYACL_SAMPLES"),
    reason="SIMNPU_PYACL_SAMPLES (a checkout of github.com/Ascend/samples) is not set",
)
@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_public_ascend_sample_runs_unchanged(daemon, path):
    arguments, success = PUBLIC[path]
    result = run(daemon, pathlib.Path(os.environ["SIMNPU_PYACL_SAMPLES"]) / path, arguments)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "failed ret" not in output, output  # their check_ret logs every non-zero code
    assert "At memcpy device data is [7 7 7" in output, output
    assert success in output, output
