"""One rank's HCCL collective or send/recv (HcclAllReduce, ...): when its stream reaches it,
it waits for the other ranks' (server/collectives.py matches them and runs the data
movement on AI cores), and completes with them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import hccl_types as ht
from simnpu.server.tasks.copy import span_access

from .base import Task

if TYPE_CHECKING:
    from simnpu.server.collectives import Call
    from simnpu.server.communicators import Member
    from simnpu.server.objects import Stream
    from simnpu.server.scheduler import Scheduler


class CollectiveTask(Task):
    __slots__ = ("call", "key", "member")
    kind = "collective"
    timed = True
    capturable = False  # ranks match collectives by call order: a replay cannot take part yet

    def __init__(self, seq: int, stream: Stream, member: Member, key: tuple, call: Call):
        super().__init__(seq, stream)
        self.member = member  # the rank, in its communicator
        self.key = key  # which collective of the communicator it is (server/collectives.py)
        self.call = call

    def start(self, scheduler: Scheduler) -> bool:
        scheduler.collectives.arrive(self)  # completes it once every rank has come (or failed)
        return False

    def discarded(self, scheduler: Scheduler) -> None:
        scheduler.collectives.discarded(self)  # the other ranks must not wait for it

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
