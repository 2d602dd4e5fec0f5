"""Contexts, streams and events as the scheduler works on them, and the failures their tasks
report (the client that owns them: server/core/owner.py).

Sessions create them and hand them to the scheduler; after that their mutable state is
changed under the scheduler lock only. Tasks are in server/core/tasks/.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.recorder import Recorder
    from simnpu.server.core.tasks import Task
    from simnpu.server.core.tasks.event import RecordTask
    from simnpu.server.core.waiters import Waiter
    from simnpu.shm.notify import StreamSignal


CUBE, VECTOR = codes.ACL_RT_DEV_RES_CUBE_CORE, codes.ACL_RT_DEV_RES_VECTOR_CORE


@dataclass(eq=False)
class Failure:
    """A task failure as ACL reports it at synchronize: code, message, the task's sequence
    number; `told` once an event's success has sent it to the client as a warning."""

    code: int
    message: str
    seq: int
    told: bool = False


@dataclass(eq=False)
class Context:
    handle: int
    device: int
    owner: Owner
    failure_mode: int = codes.ACL_CONTINUE_ON_FAILURE
    failure: Failure | None = None  # ACL_STOP_ON_FAILURE: the first failure, sticky
    streams: list[Stream] = field(default_factory=list)
    events: int = 0  # how many events of it are not destroyed
    overflow: bool = (
        False  # a kernel of it raised the overflow flag (server/units/float_overflow.py)
    )


@dataclass(eq=False)
class Stream:
    handle: int
    context: Context
    priority: int
    flags: int = 0
    tasks: deque[Task] = field(default_factory=deque)
    failure: Failure | None = None  # ACL_CONTINUE_ON_FAILURE: reported once at the next sync
    clock: int = 0  # device time at which the stream's last finished task ended
    watchers: list[Waiter] = field(default_factory=list)  # re-checked as its tasks complete
    destroyed: bool = False
    queued_ready: bool = False  # in its device's ready list
    signal: StreamSignal | None = None  # its completion signal (docs/fast-path.md)
    # aclrtSetStreamResLimit: {aclrtDevResLimitType: cores}, as set
    res_limits: dict[int, int] = field(default_factory=dict)
    # what takes its tasks instead of running them as they are (server/core/recorder.py: a
    # capture, a model it is bound to, a task group it updates), and the sequence number of
    # the last task a recorder took, which its signal covers once it drains
    recorder: Recorder | None = None
    recorded_upto: int = 0
    device: int = field(init=False)  # its context's
    owner: Owner = field(init=False)  # its context's
    saturation: bool = field(init=False)  # its float results saturate (aclrtSetDeviceSatMode)

    def __post_init__(self) -> None:
        self.device = self.context.device
        self.owner = self.context.owner
        self.saturation = self.owner.saturation

    def limits(self, cores: int) -> tuple[int, int]:
        """(cube, vector) core limits in force on the stream, of a device of `cores` AI
        cores: its own where set, else its owner's on the device, else every core."""
        device = self.owner.res_limits.get(self.device, {})
        return (
            self.res_limits.get(CUBE, device.get(CUBE, cores)),
            self.res_limits.get(VECTOR, device.get(VECTOR, cores)),
        )

    def core_limit(self, cores: int) -> int:
        """The AI cores its work may run on (the smaller of its two limits in force)."""
        if not self.res_limits:
            return self.owner.core_limits.get(self.device, cores)
        return min(self.limits(cores))

    def drained_upto(self, seq: int) -> bool:
        """True when every task submitted up to `seq` has finished."""
        return not self.tasks or self.tasks[0].seq > seq


@dataclass(eq=False)
class Event:
    handle: int
    context: Context
    flags: int
    latest_record: RecordTask | None = None
    # ACL_EVENT_EXTERNAL: the streams whose wait found no record, woken by the next one
    waiting: list[Stream] = field(default_factory=list)
