"""The runner: what a unit process does with a batch, and the kernel API its kernels see.

`WorkRunner` runs the items of a batch (server/core/unit_protocol.py) on mapped memory and
returns their results; it knows nothing of pipes or processes (unit tests run it in threads).
`serve_batches` is the one batch loop, run by a trusted worker (server/units/worker_main.py)
and by a client's kernel process (server/units/kernel_process_main.py) alike: receive a batch
over the unit's pipe, run it, send the results, and hand Cancel messages that arrive while
a batch runs to the runner. Kernels see device memory through `KernelContext`; what they
print goes to the runner's `KernelPrints`.
"""

from __future__ import annotations

import select
import time
import traceback
import types
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import posix_ipc

from simnpu.proto import codes
from simnpu.proto.kernel_abi import canonical_type
from simnpu.server.core.unit_protocol import (
    DAEMON_GONE,
    ITEMS,
    Cancel,
    CopyBytes,
    FillBytes,
    ForgetSegment,
    LoadModule,
    MapBacking,
    MapWindows,
    RandomNumbers,
    ReduceBytes,
    ReducePiece,
    Result,
    RunKernel,
    RunKernels,
    WriteSignal,
    next_message,
)
from simnpu.server.units import collective_pieces, random_numbers, reduce_async
from simnpu.server.units.device_printf import KernelOutput
from simnpu.server.units.float_overflow import OverflowFlag, saturate
from simnpu.server.units.span_memory import SpanMemory
from simnpu.shm.addresses import split_device_address
from simnpu.shm.notify import NotifyArea

_NUMPY_OF_CANONICAL = {
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
}


class MemoryFault(Exception):
    """A kernel asked for device memory outside the allocations it was given."""

    access: tuple[int, int, str] | None = None  # (address, bytes, access): set when checking


class KernelPrints:
    """Where a running kernel's `ctx.printf` and `print` go: to the unit's `KernelOutput`
    (server/units/device_printf.py), told of the batch, the piece and the block only when a
    block prints, so a kernel that prints nothing costs no call into it. The runner sets
    `name` and `num_blocks` as a piece starts, a KernelContext `block` as its block starts;
    `finish` takes the piece's output once it has printed (`started`)."""

    __slots__ = ("_at", "_output", "block", "fresh_batch", "name", "num_blocks", "started")

    def __init__(self) -> None:
        self._output = KernelOutput()
        self.name = ""  # the launch of the piece running
        self.num_blocks = 0
        self.block = -1  # the block running (-1: none: what is printed is dropped)
        self.fresh_batch = True  # nothing of the batch running has printed yet
        self.started = False  # the piece running has printed: the output has started it
        self._at = -1  # the block the output was last told of

    def _to_block(self) -> KernelOutput:
        """The output, at the running block (a piece it starts, in a batch it starts)."""
        output = self._output
        block = self.block
        if block >= 0:
            if not self.started:
                if self.fresh_batch:
                    output.new_batch()
                    self.fresh_batch = False
                output.start(self.name, self.num_blocks)
                self.started = True
                self._at = -1
            if block != self._at:
                output.block(block)
                self._at = block
        return output

    def printf(self, fmt: str, *args: Any) -> None:
        self._to_block().printf(fmt, *args)

    def print(self, *values: Any, **kw: Any) -> None:
        """`print` as a kernel module sees it (KernelOutput.print)."""
        self._to_block().print(*values, **kw)

    def finish(self) -> str:
        """The started piece's formatted output (KernelOutput.finish)."""
        self.started = False
        return self._output.finish()


class KernelContext:
    """What a kernel sees as `ctx`: its block, its core, bounded views of device memory, the
    device printf, the overflow flag and the float overflow mode."""

    __slots__ = (
        "_bounds",
        "_maps",
        "_output",
        "_overflow",
        "block_idx",
        "block_num",
        "core_id",
        "saturation",
    )

    def __init__(
        self,
        block_idx: int,
        block_num: int,
        core_id: int,
        bounds: tuple,
        maps: list,
        output: KernelPrints,
        overflow: OverflowFlag,
        saturation: bool,
    ):
        self.block_idx = block_idx
        self.block_num = block_num
        self.core_id = core_id
        self._bounds = bounds
        self._maps = maps
        self._output = output
        self._overflow = overflow
        # the launch's stream computes in ACL_RT_OVERFLOW_MODE_SATURATION (aclrtSetDeviceSatMode)
        self.saturation = saturation
        output.block = block_idx

    def raise_overflow(self) -> None:
        """Raise the launch's float overflow flag: its context's overflow status is set once
        the launch has run (aclrtGetOverflowStatus reads it)."""
        self._overflow.set()

    def saturate(self, values) -> None:
        """In the saturation mode, saturate the float results in `values` in place (+-inf to
        the type's largest finite value of that sign, NaN to 0); in the Inf/NaN mode leave
        them as they are."""
        if self.saturation:
            saturate(values)

    def printf(self, fmt: str, *args) -> None:
        """AscendC::printf: `fmt` is a C format. The text reaches the launching client's
        stdout when it synchronizes, after a DumpHead line naming this block."""
        self._output.printf(fmt, *args)

    def gm(self, ptr, dtype, count, access="rw"):
        """A numpy view of `count` elements of device memory at `ptr` (global memory).

        The view may not extend past the allocation containing `ptr`; access="r" gives
        a read-only view.
        """
        if access not in ("r", "w", "rw"):
            raise ValueError(f"access must be 'r', 'w' or 'rw', not {access!r}")
        dt = _dtype(dtype)
        count = int(count)
        if count < 0:
            raise ValueError(f"negative element count {count}")
        nbytes = count * dt.itemsize
        for start, size in self._bounds:
            if start <= ptr < start + size or (nbytes == 0 and ptr == start + size):
                if ptr + nbytes > start + size:
                    raise MemoryFault(
                        f"view of {nbytes} bytes at {ptr:#x} runs {ptr + nbytes - start - size} "
                        f"bytes past the end of its allocation [{start:#x}, +{size})"
                    )
                device, offset = split_device_address(ptr)
                view = np.frombuffer(self._maps[device], dt, count, offset)
                if access == "r":
                    view.flags.writeable = False
                return view
        for start, size in self._bounds:
            if size < 0 and start <= ptr < start - size:  # (launch_arguments: a reserved range)
                raise MemoryFault(
                    f"address {ptr:#x} lies in the reserved range [{start:#x}, +{-size}) "
                    "where nothing is mapped"
                )
        raise MemoryFault(f"address {ptr:#x} is not inside any allocation passed to this kernel")


def _dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype not in ("float32", "float16", "float64"):
        try:
            return np.dtype(_NUMPY_OF_CANONICAL[canonical_type(dtype)])
        except (ValueError, KeyError):
            pass
    return np.dtype(dtype)


# How often a running batch asks whether it was cancelled: between the blocks of a chunk, and
# between the kernels of a run (a poll of the unit's pipe costs more than a tiny kernel runs).
CANCEL_CHECK_NS = 1_000_000


class WorkRunner:
    """Runs batches for the unit `core_id` on the device memory `device_maps` (index =
    device; `device_segments` are their names), host segments by name on first use
    (`memory`). `report` sends a report of a checked kernel (Accesses) at once, before the
    batch's results."""

    def __init__(
        self,
        core_id: int,
        device_maps: list,
        device_segments: list[str],
        report: Callable[[object], None],
        remap: Callable[[MapWindows | MapBacking], None] | None = None,
    ):
        self.core_id = core_id
        # maps a MapWindows table or MapBacking changes into the device windows (workers only)
        self.remap = remap
        self.maps = device_maps  # what kernels' views and reductions read and write
        self.report = report
        self.modules: dict[int, types.ModuleType] = {}
        self.memory = SpanMemory(device_segments, device_maps)  # copies' and reduces' memory
        self.signals: dict[str, NotifyArea] = {}
        self._written: list[tuple[NotifyArea, int]] = []  # signals written, waiters not woken
        self._cancelled: Callable[[], set[int]] = set
        self.output = KernelPrints()  # what the running launch prints
        self.overflow = OverflowFlag()  # whether it raised the overflow flag

    def run(self, batch: list[tuple], cancelled: Callable[[], set[int]]) -> list[Result]:
        """Run `batch` (packed items, server/core/unit_protocol.py) in order; `cancelled()` gives
        the tokens cancelled so far (asked before a kernel that is not the batch's first: the head
        of a run never is -- at most every CANCEL_CHECK_NS; and between the blocks of a chunk, every
        CANCEL_CHECK_NS)."""
        self._cancelled = cancelled
        self.output.fresh_batch = True
        results: list[Result] = []
        clean = True  # every item so far succeeded and ran: a WriteSignal may be written
        taken: set[int] = set()  # the cancellations taken so far
        check_at = time.monotonic_ns() + CANCEL_CHECK_NS
        for index, packed in enumerate(batch):
            kind = ITEMS[packed[0]]
            if kind is RunKernel:
                if index:
                    now = time.monotonic_ns()
                    if now >= check_at:
                        taken = cancelled()
                        check_at = now + CANCEL_CHECK_NS
                    if packed[1] in taken:
                        results.append(Result(packed[1], 0, now, now, ""))
                        clean = False
                        continue
                result = self.run_kernel(*packed[1:])
            elif kind is CopyBytes:
                copy = CopyBytes.unpack(packed)
                result = self._timed(copy.token, self.memory.copy, copy.dst, copy.src, copy.count)
            elif kind is FillBytes:
                fill = FillBytes.unpack(packed)
                result = self._timed(fill.token, self.memory.fill, fill.dst, fill.value, fill.count)
            elif kind is ReducePiece:
                result = collective_pieces.execute(self.memory.segments, ReducePiece.unpack(packed))
            elif kind is ReduceBytes:
                item = ReduceBytes.unpack(packed)
                result = reduce_async.execute(self.memory.segments, item, self.overflow)
            elif kind is RandomNumbers:
                result = random_numbers.execute(self.memory.segments, RandomNumbers.unpack(packed))
            elif kind is RunKernels:
                result = self.run_kernels(*packed[1:])
            elif kind is WriteSignal:
                if clean:
                    self.write_signal(*packed[1:])
                continue
            elif kind is LoadModule:
                self.load(LoadModule.unpack(packed))
                continue
            elif kind is MapWindows or kind is MapBacking:
                if self.remap is not None:
                    self.remap(kind.unpack(packed))
                continue
            else:  # ForgetSegment
                self.forget(ForgetSegment.unpack(packed).name)
                continue
            results.append(result)
            if result.code or result.message or result.output:
                clean = False  # it failed, a Cancel cut it short, or it printed: the
                # scheduler publishes the signal (dirty: the client asks for the output)
        return results

    # ---- kernels --------------------------------------------------------------------------
    def load(self, item: LoadModule) -> None:
        module = types.ModuleType(f"simnpu_kernels_{item.binary}")
        module.__file__ = item.filename
        module.__dict__["print"] = self.output.print  # a kernel's print is device printf
        try:
            exec(compile(item.source, item.filename, "exec"), module.__dict__)  # noqa: S102 - the kernel module
        except BaseException as exc:  # reported by every launch from this binary
            module.__dict__["__simnpu_load_error__"] = _describe(exc)
        self.modules[item.binary] = module

    def run_kernel(
        self,
        token: int,
        binary: int,
        name: str,
        args: tuple,
        first: int,
        last: int,
        num_blocks: int,
        bounds: tuple,
        saturation: bool,
    ) -> Result:
        """A RunKernel item (its fields, in order), with what its blocks printed and whether
        they raised the overflow flag."""
        prints = self.output
        prints.name = name
        prints.num_blocks = num_blocks
        overflow = self.overflow
        overflow.raised = False
        result = self._run_blocks(
            token, binary, name, args, first, last, num_blocks, bounds, saturation
        )
        prints.block = -1  # what runs between launches prints nothing
        output = prints.finish() if prints.started else ""
        if output or overflow.raised:
            return result._replace(output=output, overflow=overflow.raised)
        return result

    def run_kernels(self, token: int, kernels: tuple, stop: bool) -> Result:
        """A RunKernels item (its fields, in order): each kernel's single block in turn; what
        they printed, in order; the first failure, with its kernel's index."""
        start = end = time.monotonic_ns()
        check_at = start + CANCEL_CHECK_NS
        failure: Result | None = None
        failed = 0
        outputs: list[str] = []
        overflow = False
        for index, (binary, name, args, bounds, saturation) in enumerate(kernels):
            if index and end >= check_at:
                check_at = end + CANCEL_CHECK_NS
                if token in self._cancelled():
                    message = f"kernels from {index} of the run on were cancelled"
                    return Result(token, 0, start, end, message, "".join(outputs), overflow)
            result = self.run_kernel(token, binary, name, args, 0, 1, 1, bounds, saturation)
            end = result.end_ns
            if result.output:
                outputs.append(result.output)
            overflow = overflow or result.overflow
            if result.code and failure is None:
                failure, failed = result, index
                if stop:
                    break
        if failure is None:
            return Result(token, 0, start, end, "", "".join(outputs), overflow)
        return Result(
            token, failure.code, start, end, failure.message, "".join(outputs), overflow, failed
        )

    def _run_blocks(
        self,
        token: int,
        binary: int,
        name: str,
        args: tuple,
        first: int,
        last: int,
        num_blocks: int,
        bounds: tuple,
        saturation: bool,
    ) -> Result:
        start = time.monotonic_ns()
        module = self.modules[binary]
        load_error = module.__dict__.get("__simnpu_load_error__")
        if load_error:
            return Result(
                token,
                codes.ACL_ERROR_RT_AICORE_EXCEPTION,
                start,
                time.monotonic_ns(),
                f"kernel module failed to load on AI core {self.core_id}:\n{load_error}",
            )
        function = getattr(module, name)
        block = first
        try:
            if bounds.__class__ is not tuple:  # a checked launch: record what it touches
                import simnpu.server.units.access_log as access_log  # only checked launches use it

                block, error = access_log.run_checked(
                    self, token, function, args, first, last, num_blocks, bounds, saturation
                )
                if error is not None:
                    raise error
            else:
                overflow = self.overflow
                check_at = start + CANCEL_CHECK_NS
                for block in range(first, last):
                    context = KernelContext(
                        block,
                        num_blocks,
                        self.core_id,
                        bounds,
                        self.maps,
                        self.output,
                        overflow,
                        saturation,
                    )
                    function(context, *args)
                    now = time.monotonic_ns()
                    if now >= check_at:  # its session may have ended: skip the rest then
                        if token in self._cancelled():
                            return Result(
                                token, 0, start, now, f"blocks after {block} were cancelled"
                            )
                        check_at = now + CANCEL_CHECK_NS
        except MemoryFault as fault:
            return Result(
                token,
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                start,
                time.monotonic_ns(),
                f"memory fault in kernel {name} block {block}/{num_blocks} on AI core "
                f"{self.core_id}: {fault}\n{_describe(fault)}",
            )
        except BaseException as exc:
            return Result(
                token,
                codes.ACL_ERROR_RT_AICORE_EXCEPTION,
                start,
                time.monotonic_ns(),
                f"kernel {name} raised in block {block}/{num_blocks} on AI core {self.core_id}:\n"
                f"{_describe(exc)}",
            )
        return Result(token, 0, start, time.monotonic_ns(), "")

    # ---- copies and fills ---------------------------------------------------------------------
    def _timed(self, token: int, action, *args) -> Result:
        start = time.monotonic_ns()
        try:
            action(*args)
        except Exception as exc:  # a segment vanished, a bad offset: fail the task, not the engine
            return Result(
                token,
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                start,
                time.monotonic_ns(),
                f"copy engine {self.core_id}: {exc}",
            )
        return Result(token, 0, start, time.monotonic_ns(), "")

    def write_signal(self, segment: str, slot: int, seq: int) -> None:
        """A WriteSignal item (its fields): write a stream's completion signal; its client
        is woken by wake_clients, once the batch's report is sent (docs/fast-path.md)."""
        area = self.signals.get(segment)
        if area is None:
            try:
                area = self.signals[segment] = NotifyArea(self.memory.host_segment(segment).map)
            except posix_ipc.ExistentialError:  # the session ended meanwhile: nobody waits
                return
        area.set_done(slot, seq, False, wake=False)
        self._written.append((area, slot))

    def wake_clients(self) -> None:
        """Wake the waiters of the signals the last batch wrote. Called after its report is
        sent: a client woken sooner takes this process's CPU before the report is out, and
        its next launch then waits for the scheduler thread to take that report before it
        can be handed out; sent first, the report is usually taken by the time the launch
        comes, and the thread that decodes the launch hands it out itself."""
        written, self._written = self._written, []
        for area, slot in written:
            area.wake_stream(slot)

    def forget(self, name: str) -> None:
        """A ForgetSegment item: host segment `name` was unlinked."""
        area = self.signals.pop(name, None)
        if area is not None:
            area.release()
        self.memory.forget(name)


_RUNNER_FRAMES = ("server/units/runner.py", "server/units/access_log.py")


def _describe(exc: BaseException) -> str:
    """The kernel's own traceback, without the runner's frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.endswith(_RUNNER_FRAMES)]
    lines = traceback.format_list(own) + traceback.format_exception_only(type(exc), exc)
    return "Traceback (most recent call last):\n" + "".join(lines)


def serve_batches(
    conn: Connection,
    runner: WorkRunner,
    pack: Callable[[list[Result]], Any],
    send: Callable[[Any], None],
    daemon_gone: Callable[[], None],
) -> None:
    """The batch loop of a unit process: receive a batch on `conn`, run it on `runner`, send
    its results as `pack(results)` through `send` (pickled tuples from a trusted worker, JSON
    from a kernel process: server/units/report_codec.py), then wake the clients whose signals
    it wrote. A Cancel that arrives while a batch runs goes to the runner; one that arrives
    after its batch is done is dropped. Returns when the daemon asks the process to stop
    (None), or calls `daemon_gone` and returns when the daemon's end of `conn` is gone (it
    died without stopping this process); either found while a batch runs raises SystemExit.
    What `send` raises (BrokenPipeError: the daemon closed the pipe) is raised, after the
    wake-ups."""
    incoming = select.poll()  # one poll object: Connection.poll() builds a selector per call
    incoming.register(conn.fileno(), select.POLLIN)
    cancelled: set[int] = set()

    def take_cancellations() -> set[int]:
        """Cancellations received while the batch runs (nothing else arrives meanwhile)."""
        while incoming.poll(0):
            try:
                message = conn.recv()
            except DAEMON_GONE:
                message = None
            if message is None:  # the daemon asks this process to stop (or is gone)
                raise SystemExit(0)
            cancelled.update(message.tokens)
        return cancelled

    while True:
        try:
            batch = next_message(conn, incoming)
        except DAEMON_GONE:
            daemon_gone()
            return
        if batch is None:
            return
        if isinstance(batch, Cancel):  # it came after its batch was done
            continue
        cancelled.clear()
        try:
            send(pack(runner.run(batch, take_cancellations)))
        finally:
            runner.wake_clients()
