"""Python's cyclic garbage collector in the daemon and its AI-core and copy-engine workers
(never in a client's process or a kernel process: their programs are the users').

With CPython's defaults a young collection runs every 700 container allocations and every
tenth one of those goes on to older objects, so the daemon, which makes and drops a few
objects per launch, walked its whole heap (the modules, grpc, numpy and protobuf: ~41,000
objects) about three times a second under a stream of launches, and collecting took ~0.9 s
of every 10 s, holding the GIL that every session's ring thread needs
(docs/decisions/gc-frozen-in-daemon-and-workers.md). Once a process has started, `settle()`
moves what it holds out of every later collection (gc.freeze) and collects young objects
every YOUNG_THRESHOLD allocations: the objects a launch makes are freed by reference
counting long before.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000  # container allocations (less frees) between young collections


def settle() -> None:
    """Freeze what the process holds now out of the collector's walks and collect young
    objects less often. Call once, when the daemon or a worker has started; never blocks
    (no collection first: the little garbage of a start stays, as it would have until the
    first full collection, and a collection here delayed the first client by ~20 ms)."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
