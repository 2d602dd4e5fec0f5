"""Worker processes: the units of the daemon at work, and the executor that drives them.

`WorkRunner` runs the items of a batch (server/core/unit_protocol.py) on mapped memory and returns
their results; it knows nothing of pipes or processes (unit tests run it in threads). `main` is
a worker process: it maps the device segments, then loops -- receive a batch over its pipe,
run it, send the results -- and hands Cancel messages that arrive while a batch runs to
the runner. Kernels see device memory through `KernelContext`.

`ProcessExecutor` is the daemon's Executor (server/core/executor.py): every unit a worker
process, spawned and supervised here, its batches and reports on a pipe. Workers start per
device, when the daemon first needs the device (docs/device-memory.md); a unit whose
worker has not reported Ready is handed nothing. The scheduler
thread sleeps in `wait`, one poll() over every worker pipe and a wake-up pipe (rebuilt only
when a worker is replaced), so an idle daemon burns no CPU. Sessions' threads `send`
under the scheduler lock; only the scheduler thread reads the pipes.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import numpy as np
import posix_ipc

from simnpu.proto import codes
from simnpu.proto.kernel_abi import canonical_type
from simnpu.server.core.executor import LOST, Unit, Windows
from simnpu.server.core.unit_protocol import (
    DAEMON_GONE,
    ITEMS,
    Cancel,
    CopyBytes,
    FillBytes,
    ForgetSegment,
    LoadModule,
    MapWindows,
    RandomNumbers,
    Ready,
    ReduceBytes,
    ReducePiece,
    Result,
    RunKernel,
    RunKernels,
    Span,
    WriteSignal,
    next_message,
    pack_results,
)
from simnpu.server.hccl import reduce_plan
from simnpu.server.units import gc_tuning, random_numbers, reduce_async
from simnpu.server.units.device_printf import KernelOutput
from simnpu.server.units.float_overflow import OverflowFlag, saturate, watch_numpy
from simnpu.server.units.kernel_processes import (
    MAX_REPORT,
    BadReport,
    KernelProcess,
    KernelProcesses,
    decode_report,
)
from simnpu.shm.addresses import split_device_address
from simnpu.shm.notify import NotifyArea
from simnpu.shm.pages import PageTable, populate
from simnpu.shm.region import Region, unlink_daemon_segments

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner

log = logging.getLogger("simnpu.workers")

PREFAULT_MIN = 1 << 20  # a device write from this size on maps its pages first (prefault)
_GROUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # what a signal to the daemon's group sends


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

    def __init__(self, block_idx, block_num, core_id, bounds, maps, output, overflow, saturation):
        self.block_idx = block_idx
        self.block_num = block_num
        self.core_id = core_id
        self._bounds = bounds
        self._maps = maps
        self._output = output
        self._overflow = overflow
        # the launch's stream computes in ACL_RT_OVERFLOW_MODE_SATURATION (aclrtSetDeviceSatMode)
        self.saturation = saturation
        output.block(block_idx)

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
    device); host segments are mapped by name on first use. `report` sends a report of a
    checked kernel (Accesses) at once, before the batch's results."""

    def __init__(
        self,
        core_id: int,
        device_maps: list,
        device_segments: list[str],
        report: Callable[[object], None],
        remap: Callable[[tuple], None] | None = None,
    ):
        self.core_id = core_id
        self.remap = remap  # maps a MapWindows table into the device windows (workers only)
        self.maps = device_maps  # what kernels' views and reductions read and write
        self.report = report
        self.modules: dict[int, types.ModuleType] = {}
        self._segments: dict[str, mmap.mmap | bytearray] = dict(zip(device_segments, device_maps))
        self._host: dict[str, Region] = {}
        self._pages = PageTable()  # whether this process has touched device pages yet
        self._bases: dict[str, int] = {}  # device segment -> the address of its mapping here
        self.signals: dict[str, NotifyArea] = {}
        self._written: list[tuple[NotifyArea, int]] = []  # signals written, waiters not woken
        self._cancelled: Callable[[], set[int]] = set
        self.output = KernelOutput()  # what the running launch prints
        self.overflow = OverflowFlag()  # whether it raised the overflow flag

    def run(self, batch: list[tuple], cancelled: Callable[[], set[int]]) -> list[Result]:
        """Run `batch` (packed items, server/core/unit_protocol.py) in order; `cancelled()` gives
        the tokens cancelled so far (asked before a kernel that is not the batch's first: the head
        of a run never is -- at most every CANCEL_CHECK_NS; and between the blocks of a chunk, every
        CANCEL_CHECK_NS)."""
        self._cancelled = cancelled
        self.output.new_batch()
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
                result = self._timed(copy.token, self.copy, copy.dst, copy.src, copy.count)
            elif kind is FillBytes:
                fill = FillBytes.unpack(packed)
                result = self._timed(fill.token, self.fill, fill.dst, fill.value, fill.count)
            elif kind is ReducePiece:
                result = reduce_plan.execute(self._segments, ReducePiece.unpack(packed))
            elif kind is ReduceBytes:
                item = ReduceBytes.unpack(packed)
                result = reduce_async.execute(self._segments, item, self.overflow)
            elif kind is RandomNumbers:
                result = random_numbers.execute(self._segments, RandomNumbers.unpack(packed))
            elif kind is RunKernels:
                result = self.run_kernels(*packed[1:])
            elif kind is WriteSignal:
                if clean:
                    self.write_signal(*packed[1:])
                continue
            elif kind is LoadModule:
                self.load(LoadModule.unpack(packed))
                continue
            elif kind is MapWindows:
                if self.remap is not None:
                    self.remap(MapWindows.unpack(packed).windows)
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
        self.output.start(name, num_blocks)
        overflow = self.overflow
        overflow.raised = False
        result = self._run_blocks(
            token, binary, name, args, first, last, num_blocks, bounds, saturation
        )
        output = self.output.finish()
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

    # ---- copies -----------------------------------------------------------------------------
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

    def memory(self, span: Span, count: int) -> memoryview:
        """Bytes [span, +count) of the memory `span` names."""
        memory = self._segments.get(span.segment)
        if memory is None:
            memory = self.host_segment(span.segment).map
        if span.offset < 0 or span.offset + count > len(memory):
            raise IndexError(
                f"range [{span.offset}, +{count}) outside the {len(memory)} bytes of "
                f"{'device' if span.device >= 0 else 'host'} memory"
            )
        return memoryview(memory)[span.offset : span.offset + count]

    def copy(self, dst: Span, src: Span, count: int) -> None:
        self.prefault(dst, count)
        with self.memory(dst, count) as target, self.memory(src, count) as source:
            target[:] = source

    def fill(self, dst: Span, value: int, count: int) -> None:
        self.prefault(dst, count)
        with self.memory(dst, count) as target:
            np.frombuffer(target, np.uint8).fill(value)

    def prefault(self, dst: Span, count: int) -> None:
        """Before writing `count` bytes (PREFAULT_MIN or more) of device memory that this
        process has not touched since it was committed (its first page is not in the page
        table), map the range's pages with one madvise instead of a fault per page
        (docs/device-memory.md). OSError if the pages cannot be had (memory freed and given
        back meanwhile, on a full /dev/shm): the task fails instead of a SIGBUS."""
        memory = self._segments.get(dst.segment)
        if count < PREFAULT_MIN or not isinstance(memory, mmap.mmap):
            return
        base = self._bases.get(dst.segment)
        if base is None:
            base = self._bases[dst.segment] = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        if not self._pages.present(base + dst.offset):
            start = dst.offset & -mmap.PAGESIZE
            populate(memory, start, dst.offset + count - start)

    # ---- host segments ------------------------------------------------------------------------
    def host_segment(self, name: str) -> Region:
        region = self._host.get(name)
        if region is None:
            region = self._host[name] = Region.attach(name, populate=True)
        return region

    def write_signal(self, segment: str, slot: int, seq: int) -> None:
        """A WriteSignal item (its fields): write a stream's completion signal; its client
        is woken by wake_clients, once the batch's report is sent (docs/fast-path.md)."""
        area = self.signals.get(segment)
        if area is None:
            try:
                area = self.signals[segment] = NotifyArea(self.host_segment(segment).map)
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
        area = self.signals.pop(name, None)
        if area is not None:
            area.release()
        region = self._host.pop(name, None)
        if region is not None:
            region.close()


_WORKER_FRAMES = ("server/units/workers.py", "server/units/access_log.py")


def _describe(exc: BaseException) -> str:
    """The kernel's own traceback, without the worker's frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.endswith(_WORKER_FRAMES)]
    lines = traceback.format_list(own) + traceback.format_exception_only(type(exc), exc)
    return "Traceback (most recent call last):\n" + "".join(lines)


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies
_DAEMON_EXIT_WAIT_MS = 2000  # how long a dying daemon's last threads may take to end


def end_with_daemon(cleanup: Callable[[], None] = lambda: None) -> int:
    """From now on this worker ends when the daemon does, even in the middle of a kernel
    (prctl PR_SET_PDEATHSIG): the signal is SIGUSR2, which nobody else sends (SIGTERM and
    SIGINT to the daemon's process group are ignored: the daemon stops its workers itself);
    its handler first unlinks the segments of a daemon that died without stopping its
    workers (SIGKILL), after `cleanup`, then ends the worker as the signal would.
    Returns the daemon's pid.

    The signal comes whenever the daemon's thread that is this worker's parent ends (the
    kernel then makes another of its threads the parent, and signals again when that one
    ends). Workers start from whatever thread needed them (a session's, naming a device
    for the first time; the scheduler's, replacing a worker), so a signal while this
    process's parent is still the daemon is only a thread ending, and is ignored; once the
    daemon's last thread has ended, the parent is a process outside it. The handler asks
    nothing but getppid before it decides: a burst of these signals comes while a killed
    daemon's threads end, and it may run again inside itself."""
    parent = multiprocessing.parent_process()
    daemon_pid = parent.pid if parent is not None and parent.pid else os.getppid()
    try:
        pidfd = os.pidfd_open(daemon_pid)
    except ProcessLookupError:  # it died (and was reaped) before this worker came up
        unlink_daemon_segments(daemon_pid)
        raise SystemExit(0) from None
    daemon = select.poll()  # readable once every thread of the daemon has ended
    daemon.register(pidfd, select.POLLIN)

    def daemon_ended(signum: int, frame: types.FrameType | None) -> None:
        if os.getppid() == daemon_pid:
            return  # one of the daemon's threads ended, not the daemon
        signal.signal(signum, signal.SIG_IGN)  # once: the signal may come again meanwhile
        try:
            cleanup()
            if daemon.poll(_DAEMON_EXIT_WAIT_MS):
                unlink_daemon_segments(daemon_pid)
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGUSR2, daemon_ended)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR2, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != daemon_pid:  # it died before the signal was armed
        daemon_ended(signal.SIGUSR2, None)
    return daemon_pid


def main(core_id: int, device_segments: list[str], conn) -> None:
    """Entry point of a spawned worker process."""
    for signum in _GROUP_SIGNALS:  # the daemon decides when workers stop: a Ctrl-C or
        signal.signal(signum, signal.SIG_IGN)  # SIGTERM to its group is the daemon's alone
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)  # (blocked since its birth)
    daemon_pid = end_with_daemon()
    regions = [  # pages are committed by the daemon at allocation (docs/device-memory.md)
        Region.attach(name, device=True) for name in device_segments
    ]

    def remap(windows: tuple) -> None:
        """Map the reserved halves of the device windows as the daemon's table says."""
        for index, region in enumerate(regions):
            region.map_reserved({(o, n, f, s) for d, o, n, f, s in windows if d == index})

    runner = WorkRunner(
        core_id, [region.map for region in regions], device_segments, conn.send, remap
    )
    watch_numpy(runner.overflow)  # the built-in kernels raise the flag on float overflow
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
            if message is None:  # the daemon asks this worker to stop (or is gone)
                raise SystemExit(0)
            cancelled.update(message.tokens)
        return cancelled

    gc_tuning.settle()
    conn.send(Ready())
    while True:
        try:
            batch = next_message(conn, incoming)
        except DAEMON_GONE:  # the daemon died without stopping us (SIGKILL): clean up after it
            unlink_daemon_segments(daemon_pid)
            return
        if batch is None:
            return
        if isinstance(batch, Cancel):  # it came after its batch was done
            continue
        cancelled.clear()
        try:
            conn.send(pack_results(runner.run(batch, take_cancellations)))
        except BrokenPipeError:  # the daemon closed this worker's pipe: it stops or replaced it
            if os.getppid() != daemon_pid:  # ...or it died: clean up after it
                unlink_daemon_segments(daemon_pid)
            return
        finally:
            runner.wake_clients()


# ---- the daemon's executor -----------------------------------------------------------------------
_SPAWN = multiprocessing.get_context("spawn")
NON_TEMPORAL_TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
EXIT_WAIT_S = 2.0  # a worker that closed its pipe has this long to exit before it is killed


def _keep_working_directory_off_import_path() -> None:
    """Workers never import from the daemon's working directory, where a folder named simnpu
    would hide the installed package from every kernel: they start with PYTHONSAFEPATH=1
    (`python -P`) and take the daemon's sys.path, less the working directory that
    `python -m` put first."""
    os.environ["PYTHONSAFEPATH"] = "1"
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]


def _stream_large_copies() -> None:
    """Workers and kernel processes copy `reduce_plan.BLOCK_BYTES` or more at a time with
    non-temporal stores (glibc's GLIBC_TUNABLES, read when a process starts; other C
    libraries ignore it): a store that bypasses the cache does not read the line it
    replaces first, which an ordinary store does, and a collective writes each byte to up to
    n destinations. glibc's own threshold is far larger. A threshold
    the daemon's environment already sets is kept."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if NON_TEMPORAL_TUNABLE not in tunables:
        threshold = f"{NON_TEMPORAL_TUNABLE}={reduce_plan.BLOCK_BYTES:#x}"
        os.environ["GLIBC_TUNABLES"] = f"{tunables}:{threshold}" if tunables else threshold


class _Process:
    """One worker process and its pipe."""

    def __init__(self, unit: Unit, segments: list[str]):
        parent, child = _SPAWN.Pipe()
        self.process: BaseProcess = _SPAWN.Process(
            target=main,
            args=(unit.core_id, segments, child),
            name=f"simnpu-{unit.kind.value.replace(' ', '-')}-{unit.device}.{unit.index}",
            daemon=True,
        )
        # Born with the group's signals blocked, until main() ignores them: a worker still
        # booting (workers start while the daemon serves) must not die of a Ctrl-C either.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        child.close()
        self.conn: Connection = parent
        self.hung_up = False  # its pipe was found closed: it is exiting

    def end(self) -> str:
        """Reap the process -- a worker that hung up is waited for, one that did not (it is
        stuck) is killed at once -- and say how it ended: its own exit code or signal, or
        "stopped responding" if it had to be killed."""
        process = self.process
        process.join(EXIT_WAIT_S if self.hung_up else 0)
        if process.is_alive():
            process.kill()
            process.join(5)
            return "stopped responding"
        code = process.exitcode
        assert code is not None  # reaped: no longer alive
        if code >= 0:
            return f"exited with code {code}"
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:  # a number the signal module has no name for
            return f"was killed by signal {-code}"


class ProcessExecutor:
    """Worker processes for `units`, each mapping the device segments `segments` and the
    windows of `windows`."""

    def __init__(self, units: Sequence[Unit], segments: list[str], windows: Windows):
        self.units = units
        self._segments = segments
        self._windows = windows
        self._processes: dict[Unit, _Process] = {}
        self._lock = threading.Lock()  # guards adding workers (launch) against stop
        self._stopped = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller: select.poll | None = None  # rebuilt when a worker is replaced
        self._by_fd: dict[int, tuple[Unit, KernelProcess | _Process]] = {}
        # pipes of replaced workers: the scheduler thread may be reading one, so it closes
        # them itself, when it next builds its poll set
        self._retired: list = []
        self.kernels = KernelProcesses(segments)  # where clients' own kernels run
        self._kernels_version = -1  # of the kernel processes the poller watches
        # units whose batch a kernel process runs (or the error of getting one)
        self._running: dict[Unit, KernelProcess | OSError] = {}

    def start(self, units: Sequence[Unit]) -> None:
        """Start the kernel zygote and wait until it is ready (blocks), then launch the
        workers of `units` (the others later: `launch`); they boot meanwhile, each unit ready
        once its worker reports Ready."""
        _keep_working_directory_off_import_path()
        _stream_large_copies()
        self.kernels.start()
        self.launch(units)

    def launch(self, units: Sequence[Unit]) -> None:
        """Start the workers of `units` without waiting for them: each unit becomes ready
        when its worker's Ready report comes through `wait`, as a replaced worker's does.
        The caller may be any thread, a session's too (`end_with_daemon`)."""
        with self._lock:
            if self._stopped:
                return
            for unit in units:
                self._processes[unit] = _Process(unit, self._segments)
            self._poller = None  # the scheduler thread polls the new pipes from its next wait
        self.wake()

    def send(self, unit: Unit, batch: list, tenant: Owner | None = None) -> None:
        if tenant is not None:
            self._send_to_kernel_process(unit, batch, tenant)
            return
        process = self._processes.get(unit)
        if process is None:
            raise OSError("the daemon is stopping: its workers are gone")
        if unit.forget or unit.windows != self._windows.version:
            batch = self._mappings(unit) + batch
        try:
            process.conn.send(batch)
        except ValueError as error:  # a closed pipe
            raise OSError(str(error)) from None
        except OSError:  # the worker closed its end: it is exiting
            process.hung_up = True
            raise

    def _mappings(self, unit: Unit) -> list:
        """What `unit` unmaps and maps before its next batch: the window table if it
        changed (an aclrtMapMem since), then the segments unlinked since."""
        items = [ForgetSegment.pack(name) for name in unit.forget]
        unit.forget = []
        windows = self._windows
        if unit.windows != windows.version:
            unit.windows = windows.version
            items.insert(0, MapWindows.pack(windows.entries))
        return items

    def _send_to_kernel_process(self, unit: Unit, batch: list, tenant: Owner) -> None:
        """A batch of `tenant`'s own kernels goes to its kernel process for `unit`
        (server/units/kernel_processes.py), with the modules that process has not loaded yet.
        Under the kernel processes' lock, as every use of a kernel process's socket is: a
        process ended meanwhile by another thread (a free) closes its socket, and a send
        racing that close could write into whatever descriptor reused its number."""
        with self.kernels.lock:
            try:
                process, _ = self.kernels.process_for(tenant, unit)
            except OSError as error:
                self._running[unit] = error
                raise
            items = []
            tokens = []
            for item in batch:
                tag = item[0]
                if tag == LoadModule.TAG:
                    if item[1] in process.loaded:
                        continue
                    process.loaded.add(item[1])
                elif tag == RunKernel.TAG or tag == RunKernels.TAG:
                    tokens.append(item[1])
                items.append(item)
            process.tokens = tokens
            process.sent_ns = time.monotonic_ns()
            process.busy = True
            self._running[unit] = process
            if self._kernels_version != self.kernels.version:
                self.wake()  # the scheduler thread polls the new process from its next wait
            try:
                process.conn.send(items)
            except (OSError, ValueError) as error:
                raise OSError(str(error)) from None

    def cancel(self, unit: Unit, tokens: list[int]) -> None:
        with self.kernels.lock:  # (a kernel process's socket: see _send_to_kernel_process)
            running = self._running.get(unit)
            if isinstance(running, KernelProcess):
                conn = running.conn
            elif unit in self._processes:
                conn = self._processes[unit].conn
            else:  # stopped: the workers are gone with what they ran
                return
            try:
                conn.send(Cancel(tokens))
            except (OSError, ValueError):  # it died: its results never come; it is replaced
                pass

    def wait(self, timeout_s: float) -> list[tuple[Unit, int, Any]]:
        if self._poller is None or self._kernels_version != self.kernels.version:
            self._rebuild_poller()
        assert self._poller is not None  # _rebuild_poller sets it
        by_fd = self._by_fd
        reports = []
        for fd, _ in self._poller.poll(math.ceil(timeout_s * 1000)):
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
                continue
            unit, process = by_fd.get(fd, (None, None))
            if unit is None or process is None:
                continue
            if isinstance(process, KernelProcess):
                report = self._kernel_report(unit, process)
                if report is not None:
                    reports.append((unit, unit.generation, report))
                continue
            generation = unit.generation
            if self._processes.get(unit) is not process:  # replaced since the poll set was made
                continue
            try:
                report = process.conn.recv()
            except (EOFError, OSError):
                process.hung_up = True
                reports.append((unit, generation, LOST))
                continue
            reports.append((unit, generation, report))
        return reports

    def _kernel_report(self, unit: Unit, process: KernelProcess) -> Any:
        """What `process` reported, checked (it is untrusted), or LOST; None if there is
        nothing to report (it ended while idle, or it no longer runs the unit's batch)."""
        running = self._running.get(unit) is process
        try:
            with self.kernels.lock:  # (its socket: see _send_to_kernel_process)
                if process.conn.closed:  # ended meanwhile (the poll set is rebuilt next time)
                    return LOST if running else None
                data = process.conn.recv_bytes(MAX_REPORT)
            report = decode_report(data, process.tokens, process.sent_ns)
        except (EOFError, OSError, BadReport) as error:
            process.hung_up = not isinstance(error, BadReport)
            if isinstance(error, BadReport):
                log.warning(
                    "%s: the kernel process of %r sent a bad report (%s); ending it",
                    unit.name,
                    process.owner,
                    error,
                )
            if running:
                return LOST
            self.kernels.lost(process)  # it died idle: its next batch gets a new one
            return None
        if not running:
            return None
        if report.__class__ is list:  # its batch is done
            del self._running[unit]
            self.kernels.batch_done(process)
        return report

    def _rebuild_poller(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        self._kernels_version = self.kernels.version
        by_fd: dict[int, tuple[Unit, KernelProcess | _Process]] = {}
        with self._lock:
            processes = list(self._processes.items())
            retired, self._retired = self._retired, []
        for conn in retired:
            conn.close()
        for unit, process in processes:
            try:
                fd = process.conn.fileno()
            except OSError:  # closed: stopped meanwhile
                continue
            by_fd[fd] = (unit, process)
        for kernel_process in self.kernels.processes():
            try:
                by_fd[kernel_process.conn.fileno()] = (kernel_process.unit, kernel_process)
            except OSError:  # ended meanwhile
                continue
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        self._by_fd = by_fd
        self._poller = poller

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def restart(self, unit: Unit) -> str:
        if self._stopped:  # the daemon is stopping: nothing is replaced
            unit.generation += 1
            unit.reset()
            return "was stopped with the daemon"
        running = self._running.pop(unit, None)
        if running is not None:  # a kernel process ran the batch: end it, keep the worker
            unit.generation += 1
            unit.restarts += 1
            unit.inflight = {}
            unit.deadline = None
            unit.lent = None
            if isinstance(running, KernelProcess):
                how = self.kernels.lost(running)
                return f"(the kernel process of {running.owner!r}) {how}"
            return f"(no kernel process: {running})"
        old = self._processes[unit]
        how = old.end()
        new = _Process(unit, self._segments)
        with self._lock:
            self._processes[unit] = new
            self._retired.append(old.conn)
        # only now: a report the scheduler thread reads from the old pipe meanwhile carries
        # the old generation, and is dropped as a replaced unit's
        unit.generation += 1
        unit.restarts += 1
        unit.reset()
        self._poller = None  # the scheduler thread polls the new pipe from its next wait
        self.wake()
        return how

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self.kernels.stop()
        for process in self._processes.values():
            try:
                process.conn.send(None)
            except (OSError, ValueError):
                pass
        for process in self._processes.values():
            process.process.join(2.0)
            if process.process.is_alive():
                process.process.kill()
                process.process.join(2.0)
            process.conn.close()
        self._processes.clear()
        for conn in self._retired:
            conn.close()
        self._retired.clear()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
