"""What the parts of one Runtime share, given to each at construction (client/runtime/runtime.py
makes it): a part takes from it what it uses, and nothing of another part but what the
Runtime hands it besides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simnpu.client.capture_modes import CaptureModes
    from simnpu.client.hostmem import PinnedBlocks
    from simnpu.client.runtime.allocation_index import AllocationIndex
    from simnpu.client.runtime.calls import Calls
    from simnpu.client.runtime.contexts import Contexts
    from simnpu.client.transport import Connection


@dataclass(frozen=True, slots=True)
class Shared:
    """The session's calls and state every part may need."""

    calls: Calls  # how a part sends a request, a posted request or a command
    connection: Connection  # the session itself (its call log; hot paths send on it directly)
    contexts: Contexts  # devices, contexts, the current context, stream and event records
    allocations: AllocationIndex  # the device ranges this process may use
    host: PinnedBlocks  # this process's pinned blocks
    capture_modes: CaptureModes  # which calls stream captures refuse
