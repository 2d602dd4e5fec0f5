"""A kernel launch (aclrtLaunchKernel*): blocks handed to free AI cores in chunks.

A launch's blocks go out in chunks (`block_chunk` below) to whichever AI cores of its
device are free. Consecutive single-block launches of a stream go to one core in one batch
(`run_length` below, task aggregation): stream order makes them run one
after the other anyway -- as many as ran in about a millisecond the last time
(`run_budget`), so that a run holds a core from the other clients no longer than that, or
than one kernel (docs/architecture.md, "Fair AI cores"). Arguments that lie in device
memory (aclrtLaunchKernel) are read when the launch reaches the head of its stream, so
tasks before it may still write them.
Pointer arguments are resolved (translated, and the allocations they reach found) by the
`ArgumentResolver` the launch is given: its client's memory (server/memory/launch_arguments.py).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Protocol

from simnpu.proto import codes
from simnpu.proto.commands import BUILTIN_BINARY
from simnpu.proto.errors import NpuError
from simnpu.server.core.executor import UnitKind
from simnpu.server.core.unit_protocol import CheckedBounds, LoadModule, RunKernel
from simnpu.shm.addresses import split_device_address

from .base import DeviceWork, Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.functions import Function
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


class ArgumentResolver(Protocol):
    """What a launch's pointer arguments reach: its client's memory."""

    def resolve(self, function: Function, values: tuple) -> tuple[tuple, tuple]:
        """(the values with pointers translated, (start, size) of each allocation they reach)."""
        ...

    def read(self, address: int, size: int) -> bytes:
        """The bytes of arguments in device memory, checked to be the client's; NpuError."""
        ...


# ---- its policies: small pure functions (tests/server/test_policy.py) ------------------------
def block_chunk(remaining: int, total_cores: int) -> int:
    """How many of a launch's remaining blocks to hand one free AI core at once.

    An even share of what is left over all cores of the device, so that a launch with
    numBlocks = cores runs one block per core, and a big launch costs a handful of
    messages rather than one per block.
    """
    return max(1, -(-remaining // total_cores))


MAX_RUN = 64


def run_length(num_blocks_of_following: list[int], limit: int = MAX_RUN) -> int:
    """How many of the kernels queued behind a single-block launch on the same stream to
    hand the same core in one message ("task aggregation").

    Stream order makes them run one after the other anyway, so a run of consecutive
    single-block launches loses no parallelism by going to one core, and saves a message
    and a wake-up per task. The run stops at the first launch with several blocks.
    """
    count = 0
    for blocks in num_blocks_of_following:
        if blocks != 1 or count >= limit - 1:
            break
        count += 1
    return count


RUN_BUDGET_NS = 1_000_000


def run_budget(ran_ns: list[int | None], budget_ns: int = RUN_BUDGET_NS) -> int:
    """How many of the kernels queued behind a single-block launch may ride along with it,
    by how long each ran the last time (`ran_ns`: the launch's own first, then theirs; None:
    never yet): as many as fit with it in `budget_ns` of one core, none if it alone does
    not, and none past a kernel never seen to run.

    A run is the one thing besides a single kernel that holds a core from the other
    clients waiting for their turn (server/core/scheduler.py, `pick_client`): budgeted, the
    longest they wait for a core is about one kernel, or `budget_ns` of tiny ones, while a
    run of empty kernels still fills its message (MAX_RUN)."""
    spent = 0
    for index, ns in enumerate(ran_ns):
        if ns is None:
            return max(0, index - 1)
        spent += ns
        if spent > budget_ns:
            return max(0, index - 1)
    return max(0, len(ran_ns) - 1)


class KernelTask(DeviceWork):
    __slots__ = ("args", "args_at", "bounds", "checked", "function", "num_blocks", "resolver")
    kind = "kernel"
    unit_kind = UnitKind.AI_CORE

    def __init__(
        self,
        seq: int,
        stream: Stream,
        function: Function,
        num_blocks: int,
        args: tuple | None,
        resolver: ArgumentResolver,
        args_at: tuple[int, int] | None = None,
    ):
        Task.__init__(self, seq, stream)
        self.handed = self.out = 0
        self.total = num_blocks
        self.function = function
        self.num_blocks = num_blocks
        self.resolver = resolver
        self.args_at = args_at  # (address, size) of arguments in device memory (aclrtLaunchKernel)
        bounds: tuple = ()  # (start, size) of the allocations it may touch
        if args is not None and "ptr" in function.signature.types:
            args, bounds = resolver.resolve(function, args)
        self.args = args  # the parameter values; None until read from `args_at`
        self.bounds = bounds
        self.checked = False  # its units record what each block touches (for a subscriber)

    @property
    def what(self) -> str:
        return self.function.name

    @property
    def tenant(self) -> Owner | None:
        return None if self.function.binary.id == BUILTIN_BINARY else self.stream.owner

    def start(self, scheduler: Scheduler) -> bool:
        if self.args is None:
            assert self.args_at is not None, "a launch has its arguments or where they are"
            function = self.function
            try:
                values = function.signature.unpack(self.resolver.read(*self.args_at))
                self.args, self.bounds = self.resolver.resolve(function, values)
            except NpuError as error:
                self.fail(
                    error.code, f"launch arguments of kernel {function.name}: {error.message}"
                )
                return True
        scheduler.make_ready(self.stream, self.unit_kind)
        return False

    def hand_out(
        self, scheduler: Scheduler, unit: Unit, units: int
    ) -> tuple[list, Task | None, bool]:
        n = self.num_blocks
        first = self.handed
        last = min(n, first + block_chunk(n - first, units))
        items: list = []
        self._add_item(scheduler, unit, first, last, items)
        if last < n:
            return items, None, False
        final: KernelTask = self
        if n == 1 and self.stream.context.failure_mode == codes.ACL_CONTINUE_ON_FAILURE:
            final = self._add_run(scheduler, unit, items)
        return items, (final if first == 0 else None), True

    def _add_item(
        self, scheduler: Scheduler, unit: Unit, first: int, last: int, items: list
    ) -> None:
        binary = self.function.binary
        if (
            binary.id != BUILTIN_BINARY
        ):  # its kernel process loads it once (server/units/process_executor.py)
            items.append(LoadModule.pack(binary.id, binary.source, binary.filename))
        elif binary.id not in unit.loaded:
            items.append(LoadModule.pack(binary.id, binary.source, binary.filename))
            unit.loaded.add(binary.id)
        token = scheduler.hand(unit, self)
        if last - first < self.num_blocks:  # the timeline names a partial launch's blocks
            for subscriber in scheduler.subscribers:
                subscriber.handed(token, first, last)
        self.state = TaskState.DISPATCHED
        self.handed = last
        self.out += 1
        bounds = CheckedBounds(self.bounds) if self.checked else self.bounds
        items.append(
            RunKernel.pack(
                token,
                binary.id,
                self.function.name,
                self.args,
                first,
                last,
                self.num_blocks,
                bounds,
                self.stream.saturation,
            )
        )

    def _add_run(self, scheduler: Scheduler, unit: Unit, items: list) -> KernelTask:
        """Add the single-block launches queued behind this one to the unit's items; the
        last task of the run."""
        own_ns = self.function.ran_ns
        if own_ns is None or own_ns > RUN_BUDGET_NS:
            return self  # (it alone is the budget: run_budget would say 0)
        following: list[KernelTask] = []
        blocks: list[int] = []
        ran_ns: list[int | None] = [own_ns]
        tenant = self.tenant
        for task in itertools.islice(self.stream.tasks, 1, MAX_RUN):
            if (
                not isinstance(task, KernelTask)
                or task.state != TaskState.PENDING
                or task.args is None  # arguments in device memory: read once the tasks before ran
                or task.tenant is not tenant  # built-in and own kernels run in different places
                or task.limits_from is not self.limits_from  # other cores may be allowed
            ):
                break
            following.append(task)
            blocks.append(task.num_blocks)
            ran_ns.append(task.function.ran_ns)
        count = min(run_length(blocks), run_budget(ran_ns))
        for task in following[:count]:
            task._add_item(scheduler, unit, 0, 1, items)
        return following[count - 1] if count else self

    def describe(self) -> tuple[str, str, dict]:
        return self.function.name, "kernel", {"blocks": self.num_blocks}

    def timeline_entry(self) -> tuple[str | None, int]:
        return self.function.name, self.num_blocks

    def record_accesses(self) -> None:
        self.checked = True

    def accesses(self) -> list[tuple]:
        out = []
        for lo, hi, write, b0, b1 in getattr(self.probe, "accesses", ()):
            device, _ = split_device_address(lo)
            out.append(("dev", device, lo, hi, write, (b0, b1)))
        return out
