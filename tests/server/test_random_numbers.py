"""simnpu's Philox4x32-10 (server/units/random_numbers.py) against the known answers of the
algorithm's reference implementation (Random123's kat_vectors)."""

from __future__ import annotations

import numpy as np

from simnpu.server.units.random_numbers import philox


def test_philox_known_answers():
    assert philox(0, 0, 1).tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = philox((1 << 64) - 1, (1 << 128) - 1, 1).tolist()
    assert ones == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    pi = philox(0x299F31D0A4093822, 0x0370734413198A2E85A308D3243F6A88, 1).tolist()
    assert pi == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_blocks_are_consecutive_counters_with_carry():
    """Block i is Philox(counter + i), carrying across the 64-bit halves."""
    start = (1 << 64) - 2
    together = philox(7, start, 4)
    apart = np.concatenate([philox(7, start + i, 1) for i in range(4)])
    assert together.tolist() == apart.tolist()
