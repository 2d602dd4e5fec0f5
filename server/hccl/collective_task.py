"""One rank's HCCL collective or send/recv (HcclAllReduce, ...): when its stream reaches it,
it waits for the other ranks' (server/hccl/collectives.py matches them and runs the data
movement on AI cores), and completes with them.

Its place in the communicator's call order (its key) is taken at submission, in the
session's call order: an eager call's when it is submitted, a captured call's by each
replay of its graph when the replay is submitted (a recorded task takes none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import hccl_types as ht
from simnpu.server.core.tasks.base import Task
from simnpu.server.core.tasks.copy import span_access
from simnpu.server.graphs.capture import capture_of

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.hccl.collectives import Call, Collectives
    from simnpu.server.hccl.communicators import Member


class CollectiveTask(Task):
    __slots__ = ("call", "collectives", "key", "member")
    kind = "collective"
    timed = True

    def __init__(
        self, seq: int, stream: Stream, member: Member, call: Call, collectives: Collectives
    ):
        super().__init__(seq, stream)
        self.member = member  # the rank, in its communicator
        self.collectives = collectives  # the daemon's, which match and run it
        # which collective of the communicator it is (server/hccl/collectives.py); None: none
        # taken (recorded in a graph, or its communicator was destroyed before a replay)
        self.key: tuple | None = None
        self.call = call

    def submitted(self) -> None:
        stream, member = self.stream, self.member
        if capture_of(stream) is None and member.state == "ready":
            self.key = member.take_key(self.call)

    def start(self, scheduler: Scheduler) -> bool:
        self.collectives.arrive(self)  # completes it once every rank has come (or failed)
        return False

    def discarded(self, scheduler: Scheduler) -> None:
        self.collectives.discarded(self)  # the other ranks must not wait for it

    def describe(self) -> tuple[str, str, dict]:
        return self.call.describe(), "collective", {"rank": self.member.rank}

    def accesses(self) -> list[tuple]:
        """It reads its send buffer and writes its receive buffer (a broadcast works in
        place: the root reads, the others write)."""
        call = self.call
        if call.kind == ht.HCCL_CMD_BROADCAST:
            return [span_access(call.send, call.send_bytes, self.member.rank != call.root)]
        out = []
        if call.send_bytes:
            out.append(span_access(call.send, call.send_bytes, False))
        if call.recv_bytes:
            out.append(span_access(call.recv, call.recv_bytes, True))
        return out


def withdraw_head(stream: Stream, why: str) -> None:
    """The collective at the head of `stream`, if one is, no longer waits for its peers:
    they fail with 507904, naming `why`."""
    head = stream.tasks[0] if stream.tasks else None
    if isinstance(head, CollectiveTask):
        head.collectives.withdraw(head, why)
