"""Each client's share of a device's AI cores (docs/architecture.md, "Fair AI cores").

Turns alone (`pick_client`) let a client that floods many streams refill every core the
moment it frees, so another client's next launch, arriving a moment later, waits for one of
its kernels to end. So while several clients are *active* on a device -- with AI-core work
ready or running there, or done there within the share window (`--core-share-window-ms`) --
each may hold at most its share of the cores, ceil(cores / active clients), and a core
beyond a client's share stays free for the others' next launches. A client alone on a
device gets every core; work is never taken off a core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from simnpu.server.core.executor import Unit

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.streams import Stream

SHARE_WINDOW_S = 0.05
"""How long after its last AI-core work on a device a client still counts as active there
(the default of `simnpu serve --core-share-window-ms`)."""


class CoreShare:
    """The share of one device's AI cores in one hand-out: `cap` cores per client, `held`
    the cores each client holds (counting what this hand-out gives)."""

    __slots__ = ("cap", "held")

    def __init__(self, cap: int, held: dict[Owner, int]):
        self.cap = cap
        self.held = held

    def may_take(self, owner: Owner) -> bool:
        return self.held.get(owner, 0) < self.cap

    def took(self, owner: Owner) -> None:
        self.held[owner] = self.held.get(owner, 0) + 1


def core_share(
    cores: Sequence[Unit],
    ready: Sequence[Stream],
    seen: dict[Owner, float],
    now: float,
    window_s: float,
) -> tuple[CoreShare | None, float | None]:
    """(the share of `cores` in this hand-out, None when one client is active; when a
    client only counted for its recent work stops counting, if one does). `seen`: when
    each client last had AI-core work on the device (handed out or done), pruned here."""
    held: dict[Owner, int] = {}
    for unit in cores:
        if unit.inflight:
            owner = next(iter(unit.inflight.values())).stream.owner
            held[owner] = held.get(owner, 0) + 1
    active = set(held)
    active.update(stream.owner for stream in ready)
    lapses = None
    for owner, at in list(seen.items()):
        if owner in active:
            continue
        if owner.closed or now - at >= window_s:
            del seen[owner]
            continue
        active.add(owner)
        lapses = at + window_s if lapses is None else min(lapses, at + window_s)
    if len(active) <= 1:
        return None, lapses
    return CoreShare(-(-len(cores) // len(active)), held), lapses
