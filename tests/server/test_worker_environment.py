"""The environment the daemon's workers start with: large copies with non-temporal stores."""

from __future__ import annotations

import os

from simnpu.server.core.unit_protocol import REDUCE_BLOCK_BYTES
from simnpu.server.units import spawning

THRESHOLD = f"{spawning.NON_TEMPORAL_TUNABLE}={REDUCE_BLOCK_BYTES:#x}"


def test_sets_the_threshold(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    spawning.stream_large_copies()
    assert os.environ["GLIBC_TUNABLES"] == THRESHOLD


def test_keeps_other_tunables(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    spawning.stream_large_copies()
    assert os.environ["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{THRESHOLD}"


def test_keeps_a_threshold_already_set(monkeypatch):
    mine = f"{spawning.NON_TEMPORAL_TUNABLE}=0x4000000"
    monkeypatch.setenv("GLIBC_TUNABLES", mine)
    spawning.stream_large_copies()
    assert os.environ["GLIBC_TUNABLES"] == mine
