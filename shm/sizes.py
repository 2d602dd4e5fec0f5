"""Byte sizes written by people ('512MiB', '2GiB', '1048576'), for the daemon's flags and
the client's environment variables alike."""

from __future__ import annotations

import re

UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """'2GiB' -> 2147483648; plain numbers are bytes. ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 512MiB, 2GiB, 1048576)")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])
