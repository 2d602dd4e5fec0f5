"""Who sees the device's work as it happens: the scheduler's subscribers
(`Scheduler.subscribers`).

Observation (server/observation/) subscribes once a client or `simnpu serve --trace /
--check` asks for a timeline or checking; the control plane wires it (server/control/). The
scheduler, the tasks, the graphs and the control plane call every subscriber's hooks; with
nobody subscribed `subscribers` is an empty tuple, so a hook costs no call and no module
asks whether anyone observes. A task a subscriber follows carries its `probe` (set in
`submitted`): the scheduler calls `completing` only for a task that has one. A decision that
holds only while nobody sees each task (a unit writing a stream's signal, fusing a replay's
kernels, a synchronous copy done on the session's thread) asks whether `subscribers` is
empty.

Hooks are called under the scheduler lock unless a hook says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from simnpu.proto.errors import NpuError
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.tasks import RecordTask, Task
    from simnpu.server.core.unit_protocol import Accesses


class Caller(Protocol):
    """The session a host call came from, as a subscriber sees it (server/control/session.py)."""

    @property
    def owner(self) -> Owner:
        """The client."""

    @property
    def seq(self) -> int:
        """The sequence number of the call being handled."""

    def flush(self) -> None:
        """Submit what the session queued before this call."""

    def reject(self, error: NpuError) -> None:
        """Report `error` at the client's next synchronize."""


class Subscriber(Protocol):
    """What sees the device's work (server/observation/observer.py's Observer)."""

    # ---- the command path ----------------------------------------------------------------------
    def submitted(self, task: Task) -> None:
        """`task` is queued on its stream (Scheduler.queue); a followed task gets its probe."""

    def completing(self, task: Task) -> None:
        """`task`, which has a probe, completes (before its stream goes on)."""

    def handed(self, token: int, first: int, last: int) -> None:
        """Blocks `[first, last)` of a launch went out as a chunk with `token`."""

    def ran(self, unit: Unit, results: list) -> None:
        """`unit` reported a batch's results (before the scheduler takes them)."""

    def accessed(self, unit: Unit, report: Accesses) -> None:
        """What a checked kernel running on `unit` touched."""

    # ---- graphs --------------------------------------------------------------------------------
    def captured(self, task: Task) -> None:
        """`task` is being recorded by a capture (server/graphs/capture.py)."""

    def replaying(self, stream: Stream, model: int, lanes: Sequence[tuple[int, Stream]]) -> None:
        """A replay of model `model` on `stream` queues its tasks now: the tasks of each lane
        (its handle) on that lane's private stream."""

    def joined(self, into: Stream, streams: Sequence[Stream]) -> None:
        """`into` goes on only once `streams` have drained (a cond task's sub model ran)."""

    def replayed(self, into: Stream, streams: Sequence[Stream]) -> None:
        """A replay on `into` is over: its private streams `streams` have drained and go."""

    # ---- host calls (a session's thread) -------------------------------------------------------
    def sites(self, owner: Owner, done: int, seqs: Sequence[int], names: Sequence[str]) -> None:
        """The call sites of `owner`'s calls `seqs` (its calls up to `done` are handled)."""

    def site(self, owner: Owner, seq: int, name: str) -> None:
        """The call site of `owner`'s call `seq`, from its submission ring."""

    def host_synced(
        self, owner: Owner, streams: Sequence[Stream] = (), record: RecordTask | None = None
    ) -> None:
        """`owner`'s host waits for (or saw complete) these streams, this record (under the
        scheduler lock)."""

    def allocated(self, owner: Owner, seq: int, device: int, address: int, size: int) -> None:
        """aclrtMalloc (call `seq`) of `owner` gave `address`."""

    def freeing(self, caller: Caller, address: int) -> None:
        """aclrtFree of a live block of `caller`'s, before it goes."""

    def imported(self, owner: Owner, seq: int, key: str) -> None:
        """aclrtIpcMemImportByKey (call `seq`) of `owner` opened `key`."""

    def import_closed(self, owner: Owner, key: str) -> None:
        """`owner` closed its last import of `key`."""

    def session_closed(self, owner: Owner) -> None:
        """`owner`'s session ended (its queued work is done)."""
