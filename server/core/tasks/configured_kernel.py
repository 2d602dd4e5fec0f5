"""A launch of aclrtLaunchKernelWithConfig: a kernel task with its own timeout and the
device memory of its place holders, which it frees when it completes or is dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto.errors import NpuError

from .kernel import ArgumentResolver, KernelTask

if TYPE_CHECKING:
    from simnpu.server.core.functions import Function
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.tasks.base import OwnMemory


class ConfiguredKernelTask(KernelTask):
    __slots__ = ("memory", "scratch", "timeout_s")

    def __init__(
        self,
        seq: int,
        stream: Stream,
        function: Function,
        num_blocks: int,
        args: tuple,
        resolver: ArgumentResolver,
        timeout_s: float | None,
        memory: OwnMemory,
        scratch: int | None,
    ):
        super().__init__(seq, stream, function, num_blocks, args, resolver)
        self.timeout_s = timeout_s  # None: its session's operator timeout
        self.memory = memory
        self.scratch = scratch  # the block holding its place holders' data, if any

    def _release(self) -> None:
        address, self.scratch = self.scratch, None
        if address is not None and address in self.memory.allocations:
            try:
                self.memory.free(address)
            except NpuError:  # its session ended meanwhile and freed it
                pass

    def piece_done(self, scheduler: Scheduler, code: int, end_ns: int, message: str) -> None:
        if self.out == 1 and self.handed >= self.total:
            self._release()  # before the stream goes on: its signal may wake the client
        super().piece_done(scheduler, code, end_ns, message)

    def discarded(self, scheduler: Scheduler) -> None:
        self._release()

    def replica(self, stream: Stream) -> ConfiguredKernelTask:
        """A replay's copy reads the place holders' block its recorded launch owns (freed
        when the graph goes: `forgotten`)."""
        twin = super().replica(stream)
        assert isinstance(twin, ConfiguredKernelTask)
        twin.scratch = None
        return twin

    def forgotten(self) -> None:
        self._release()
