"""The worker process: an AI core or a copy engine of one simulated device.

Started with the spawn context by simnpu.server.worker_pool. It maps the device memory
regions, then loops: receive a batch of work items over its pipe, execute them in order,
send back one result per executable item. Items:

  ("load", binary_id, source, filename)           exec a kernel module once, keep it
  ("forget", segment_name)                        unmap a pinned/staging/notify segment
  ("notify", segment_name, slot, seq)             write a stream word of a notify area
                                                  (docs/fast-path.md), if the batch succeeded
  ("kernel", token, binary_id, name, args, first_block, last_block, block_num, bounds)
  ("copy", token, dst, src, count)                dst/src: ("dev", device, offset) | ("seg", name, offset)
  ("memset", token, dst, value, count)
  ("collective", token, dtype, reduce_op, groups, snapshot, piece)   see simnpu.server.reduce

While a batch runs, the daemon may send ("cancel", [token, ...]): kernels of the batch
not started yet are skipped (a force-destroyed stream, a stopped context).

Results are (token, code, start_ns, end_ns, message); code 0 is success. Timestamps come
from CLOCK_MONOTONIC, which the daemon shares, so they are the device's clock.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
import traceback
import types

import numpy as np
import posix_ipc
from simnpu.proto import codes
from simnpu.proto.kernel_abi import canonical_type
from simnpu.server import access_log, reduce
from simnpu.shm.addresses import split_device_address
from simnpu.shm.notify import NotifyArea
from simnpu.shm.region import Region, unlink_daemon_segments

_NUMPY_OF_CANONICAL = {
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "f16": "float16", "f32": "float32", "f64": "float64",
}


class MemoryFault(Exception):
    """A kernel asked for device memory outside the allocations it was given."""


class KernelContext:
    """What a kernel sees as `ctx`: its block, its core, and bounded views of device memory."""

    __slots__ = ("_bounds", "_maps", "block_idx", "block_num", "core_id")

    def __init__(self, block_idx, block_num, core_id, bounds, maps):
        self.block_idx = block_idx
        self.block_num = block_num
        self.core_id = core_id
        self._bounds = bounds
        self._maps = maps

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
                        f"view of {nbytes} bytes at {ptr:#x} runs {ptr + nbytes - start - size} bytes "
                        f"past the end of its allocation [{start:#x}, +{size})")
                device, offset = split_device_address(ptr)
                view = np.frombuffer(self._maps[device], dt, count, offset)
                if access == "r":
                    view.flags.writeable = False
                return view
        raise MemoryFault(f"address {ptr:#x} is not inside any allocation passed to this kernel")


def _dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype not in ("float32", "float16", "float64"):
        try:
            return np.dtype(_NUMPY_OF_CANONICAL[canonical_type(dtype)])
        except (ValueError, KeyError):
            pass
    return np.dtype(dtype)


class Worker:
    def __init__(self, core_id, device_regions, conn):
        self.core_id = core_id
        self.conn = conn
        self.daemon_pid = os.getppid()
        self.regions = [Region.attach(name, populate=True) for name in device_regions]  # device memory is resident
        self.maps = [region.map for region in self.regions]
        self.modules: dict[int, types.ModuleType] = {}
        self.segments: dict[str, Region] = {}
        self.notify_areas: dict[str, NotifyArea] = {}
        self._incoming = select.poll()  # one poll object: Connection.poll() builds a selector per call
        self._incoming.register(conn.fileno(), select.POLLIN)

    def serve(self) -> None:
        self.conn.send(("ready",))
        while True:
            try:
                batch = self.conn.recv()
            except EOFError:  # the daemon died without stopping us (SIGKILL): clean up after it
                unlink_daemon_segments(self.daemon_pid)
                return
            if batch is None:
                return
            if isinstance(batch, tuple):  # a cancellation that came after its batch was done
                continue
            results = []
            cancelled: set[int] = set()
            clean = True  # every item so far succeeded and ran: a "notify" may be written
            for index, item in enumerate(batch):
                kind = item[0]
                # only launches behind a run's first can be cancelled: no poll before that one
                if index and kind == "kernel" and not self.take_cancellations(cancelled):
                    return
                if kind == "kernel" and item[1] in cancelled:
                    now = time.monotonic_ns()
                    results.append((item[1], 0, now, now, ""))
                    clean = False
                    continue
                if kind == "notify":
                    if clean:
                        self.notify(*item[1:])
                    continue
                result = self.execute(item)
                if result is not None:
                    results.append(result)
                    if result[1]:
                        clean = False
            self.conn.send(results)

    def take_cancellations(self, cancelled: set) -> bool:
        """Add the tokens of cancellations received so far to `cancelled` (while a batch
        runs, nothing else arrives); False if the daemon asked this worker to stop."""
        while self._incoming.poll(0):
            try:
                message = self.conn.recv()
            except EOFError:
                return False
            if message is None:
                return False
            cancelled.update(message[1])
        return True

    def execute(self, item):
        kind = item[0]
        if kind == "kernel":
            return self.run_kernel(*item[1:])
        if kind == "copy":
            return self.timed(item[1], self.copy, *item[2:])
        if kind == "memset":
            return self.timed(item[1], self.memset, *item[2:])
        if kind == "collective":  # an HCCL collective's share of data movement
            return reduce.execute(self.maps, item)
        if kind == "load":
            self.load(*item[1:])
        elif kind == "forget":
            area = self.notify_areas.pop(item[1], None)
            if area is not None:
                area.release()
            segment = self.segments.pop(item[1], None)
            if segment is not None:
                segment.close()
        return None

    def notify(self, name, slot, seq):
        """Write stream word `slot` of the notify area `name` and wake its client."""
        area = self.notify_areas.get(name)
        if area is None:
            try:
                area = self.notify_areas[name] = NotifyArea(self.segment(name).map)
            except posix_ipc.ExistentialError:  # the session ended meanwhile: nobody waits
                return
        area.set_done(slot, seq, False)

    def load(self, binary_id, source, filename):
        module = types.ModuleType(f"simnpu_kernels_{binary_id}")
        module.__file__ = filename
        try:
            exec(compile(source, filename, "exec"), module.__dict__)
        except BaseException as exc:  # reported by every launch from this binary
            module.__dict__["__simnpu_load_error__"] = _describe(exc)
        self.modules[binary_id] = module

    def run_kernel(self, token, binary_id, name, args, first, last, block_num, bounds):
        start = time.monotonic_ns()
        module = self.modules[binary_id]
        load_error = module.__dict__.get("__simnpu_load_error__")
        if load_error:
            return (token, codes.ACL_ERROR_RT_AICORE_EXCEPTION, start, time.monotonic_ns(),
                    f"kernel module failed to load on AI core {self.core_id}:\n{load_error}")
        function = getattr(module, name)
        block = first
        try:
            if bounds.__class__ is not tuple:  # a checked launch: record what it touches
                block, error = access_log.run_checked(self, KernelContext, MemoryFault, token, function,
                                                      args, first, last, block_num, bounds)
                if error is not None:
                    raise error
            else:
                for block in range(first, last):
                    function(KernelContext(block, block_num, self.core_id, bounds, self.maps), *args)
        except MemoryFault as fault:
            return (token, codes.ACL_ERROR_RT_DEVICE_MEM_ERROR, start, time.monotonic_ns(),
                    f"memory fault in kernel {name} block {block}/{block_num} on AI core "
                    f"{self.core_id}: {fault}\n{_describe(fault)}")
        except BaseException as exc:
            return (token, codes.ACL_ERROR_RT_AICORE_EXCEPTION, start, time.monotonic_ns(),
                    f"kernel {name} raised in block {block}/{block_num} on AI core {self.core_id}:\n"
                    f"{_describe(exc)}")
        return (token, 0, start, time.monotonic_ns(), "")

    def timed(self, token, action, *args):
        start = time.monotonic_ns()
        try:
            action(*args)
        except Exception as exc:  # a segment vanished, a bad offset: fail the task, not the engine
            return (token, codes.ACL_ERROR_RT_DEVICE_MEM_ERROR, start, time.monotonic_ns(),
                    f"copy engine {self.core_id}: {exc}")
        return (token, 0, start, time.monotonic_ns(), "")

    def buffer(self, location, count):
        space, key, offset = location
        memory = self.maps[key] if space == "dev" else self.segment(key).map
        if offset < 0 or offset + count > len(memory):
            raise IndexError(f"range [{offset}, +{count}) outside {space} memory of {len(memory)} bytes")
        return memoryview(memory)[offset:offset + count]

    def segment(self, name):
        region = self.segments.get(name)
        if region is None:
            region = self.segments[name] = Region.attach(name, populate=True)
        return region

    def copy(self, dst, src, count):
        target, source = self.buffer(dst, count), self.buffer(src, count)
        target[:] = source
        target.release()
        source.release()

    def memset(self, dst, value, count):
        space, key, offset = dst
        memory = self.maps[key] if space == "dev" else self.segment(key).map
        if offset < 0 or offset + count > len(memory):
            raise IndexError(f"range [{offset}, +{count}) outside {space} memory")
        np.frombuffer(memory, np.uint8, count, offset).fill(value)


def _describe(exc: BaseException) -> str:
    """The kernel's own traceback, without the worker's frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.endswith(("server/worker.py", "server/access_log.py"))]
    lines = traceback.format_list(own) + traceback.format_exception_only(type(exc), exc)
    return "Traceback (most recent call last):\n" + "".join(lines)


def main(core_id, device_regions, conn) -> None:
    """Entry point of a spawned worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when workers stop
    worker = Worker(core_id, device_regions, conn)
    worker.serve()
    sys.exit(0)
