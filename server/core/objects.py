"""The runtime objects the scheduler works on: the owning client, its contexts, streams and
events, failures, and the waiters of blocked host calls.

Sessions create them and hand them to the scheduler; after that their mutable state is
changed under the scheduler lock only. Tasks are in server/core/tasks/.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from simnpu.proto import codes
from simnpu.server.core.untrusted import escaped
from simnpu.server.units.device_printf import PendingOutput

if TYPE_CHECKING:
    from simnpu.server.core.tasks import Task
    from simnpu.server.core.tasks.event import RecordTask
    from simnpu.server.core.tasks.host_callback import HostCallbackTask
    from simnpu.server.graphs.capture import Capture
    from simnpu.server.graphs.model_build import Build
    from simnpu.server.graphs.task_groups import TaskGroup
    from simnpu.server.units.kernel_processes import Grant
    from simnpu.shm.notify import NotifyArea, StreamSignal


CUBE, VECTOR = codes.ACL_RT_DEV_RES_CUBE_CORE, codes.ACL_RT_DEV_RES_VECTOR_CORE


@dataclass(eq=False)
class Failure:
    """A task failure as ACL reports it at synchronize: code, message, the task's sequence
    number; `told` once an event's success has sent it to the client as a warning."""

    code: int
    message: str
    seq: int
    told: bool = False


class Owner:
    """The client process that owns contexts, streams and tasks, as the scheduler and the
    tasks see it (its session keeps it up to date): who it is, its operator timeout, the
    rejected call it has not been told about, its completion signals, and where its host
    callbacks are announced."""

    def __init__(self, session_id: int, announce: Callable[[int], None]):
        self.id = session_id
        self.pid = 0
        self.process_name = "?"
        self.announce = announce  # (callback id): tell the client to run a host callback now
        self.op_timeout_s: float | None = None  # aclrtSetOpExecuteTimeOut; None: the daemon's
        self.rejected: Failure | None = (
            None  # a rejected asynchronous call, reported at the next sync
        )
        self.contexts: list[Context] = []
        self.signals: NotifyArea | None = (
            None  # its notify area, with the streams' signals (fast path)
        )
        self.waiting_callbacks: dict[int, HostCallbackTask] = {}  # blocking host callbacks by id
        self.closed = False
        self.memory_generation = 0  # changes whenever the device memory it may use does
        self.kernel_grant: Callable[[], Grant] | None = None  # what its kernel processes map
        # aclrtSetDeviceResLimit: device -> {aclrtDevResLimitType: cores}, as set; and
        # device -> the AI cores its work may run on (the smaller of the two), which the
        # scheduler reads; a device not listed has no limit
        self.res_limits: dict[int, dict[int, int]] = {}
        self.core_limits: dict[int, int] = {}
        self.output = PendingOutput()  # what its kernels printed, for its next synchronize
        # aclrtSetDeviceSatMode: True once it chose ACL_RT_OVERFLOW_MODE_SATURATION; each
        # stream takes the mode in force when it is created (Stream.saturation)
        self.saturation = False

    def __repr__(self) -> str:
        return f"session {self.id} (pid {self.pid} {escaped(self.process_name)})"

    def streams(self) -> list[Stream]:
        return [stream for context in self.contexts for stream in context.streams]


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
    # the capture recording its tasks instead of running them (server/graphs/capture.py), and the
    # sequence number of the last task it recorded, which its signal covers once it drains
    capture: Capture | None = None
    captured_upto: int = 0
    # the model it is bound to (aclmdlRIBindStream), recording its tasks
    # (server/graphs/model_build.py)
    bound: Build | None = None
    # the task group its kernel launches update (aclmdlRICaptureTaskUpdateBegin .. End)
    updating: TaskGroup | None = None
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


@dataclass(eq=False)
class Waiter:
    """A blocked host call (synchronize, destroy): `ready()` is re-checked as work completes;
    `finish(timed_out)` answers it once."""

    ready: Callable[[], bool]
    finish: Callable[[bool], None]
    deadline: float | None = None
    finished: bool = False

    def settle(self, timed_out: bool = False) -> None:
        if not self.finished:
            self.finished = True
            finish = self.finish
            # settled, it holds nothing: it may stay among the scheduler's timers until its
            # deadline, and what it would call holds its whole session
            self.ready = self.finish = _settled
            finish(timed_out)


def _settled(*_: object) -> NoReturn:
    """What a settled waiter holds in place of its callables (they are not called again)."""
    raise AssertionError("a settled waiter was used again")
