"""The malloc thresholds of in-stream copies: set on glibc (the C library here), in a process
of their own so that this test process keeps its defaults."""

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_the_thresholds_are_accepted():
    code = "from simnpu.shm import heap; print(heap.keep_freed_memory())"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
