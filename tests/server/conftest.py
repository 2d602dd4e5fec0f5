"""Fixtures of the daemon's unit tests."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture
def spawn_environment():
    """What ProcessExecutor.start sets in this process for the processes it spawns
    (server/units/spawning.py: PYTHONSAFEPATH, GLIBC_TUNABLES, sys.path) is put back after
    the test: a later test's `python script.py` must still import beside its script."""
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "GLIBC_TUNABLES")}
    path = list(sys.path)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    sys.path[:] = path
