"""The runtime objects the scheduler works on: contexts, streams, events and tasks.

Sessions create them and hand them to the scheduler; after that only the scheduler
thread changes their mutable state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simnpu.proto import codes

# task kinds
KERNEL = "kernel"
COPY = "copy"
MEMSET = "memset"
RECORD = "record"
WAIT = "wait"
RESET = "reset"
HOST = "host"  # a host callback or host function, run by the client
COLLECTIVE = "collective"  # an HCCL collective or send/recv of one rank (server/collectives.py)
COLLECTIVE_WORK = "collective work"  # the data movement of a matched collective, on AI cores

DEVICE_WORK = (KERNEL, COPY, MEMSET)

# task states
PENDING = 0
DISPATCHED = 1
DONE = 2


@dataclass(eq=False)
class Failure:
    """A task failure as ACL reports it at synchronize: code, message, the task's sequence number."""

    code: int
    message: str
    seq: int


@dataclass(eq=False)
class Context:
    handle: int
    device: int
    session: object
    failure_mode: int = codes.ACL_CONTINUE_ON_FAILURE
    failure: Failure | None = None  # STOP_ON_FAILURE: the first failure, sticky
    streams: list = field(default_factory=list)


@dataclass(eq=False)
class Stream:
    handle: int
    context: Context
    priority: int
    flags: int = 0
    tasks: deque = field(default_factory=deque)
    failure: Failure | None = None  # CONTINUE_ON_FAILURE: reported once at the next sync
    clock: int = 0          # device time at which the stream's last finished task ended
    watchers: list = field(default_factory=list)  # Waiters to re-check when a task completes
    destroyed: bool = False
    queued_ready: bool = False  # in its device's ready list
    notify_slot: int = -1       # its word in the session's notify area (docs/fast-path.md), or -1
    word_seq: int = 0           # the highest sequence number the daemon has written to that word

    @property
    def device(self) -> int:
        return self.context.device

    @property
    def session(self):
        return self.context.session

    def drained_upto(self, seq: int) -> bool:
        """True when every task submitted up to `seq` has finished."""
        return not self.tasks or self.tasks[0].seq > seq


@dataclass(eq=False)
class Event:
    handle: int
    context: Context
    flags: int
    latest_record: Task | None = None


@dataclass(eq=False, slots=True)
class Task:
    seq: int
    kind: str
    stream: Stream
    payload: tuple = ()
    state: int = PENDING
    failure: Failure | None = None
    timestamp: int = 0            # records: when the stream reached them
    waiters: list = field(default_factory=list)  # records: Waiters and blocked streams
    blocks_next: int = 0          # kernels: first block not yet handed to a core; copies: piece
    chunks_out: int = 0           # kernels, copies: pieces handed out and not yet finished
    pieces: int = 0               # copies, memsets: how many engines share it (set at dispatch)
    probe: object = None          # observed sessions: timeline and checking state (server/observe.py)


@dataclass(eq=False)
class DeviceArgs:
    """Launch arguments that lie in device memory (aclrtLaunchKernel). They are read when
    the launch reaches the head of its stream, so tasks before it may still write them."""

    read: object  # () -> (values, bounds); raises NpuError


@dataclass(eq=False)
class Waiter:
    """A blocked host call (synchronize, destroy): `ready()` is re-checked as work completes."""

    ready: object               # () -> bool
    finish: object              # (timed_out: bool) -> None
    deadline: float | None = None
    finished: bool = False

    def settle(self, timed_out: bool = False) -> None:
        if not self.finished:
            self.finished = True
            self.finish(timed_out)
