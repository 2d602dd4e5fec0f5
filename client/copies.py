"""How a memcpy / memset travels, decided on the host from the pointers alone.

- device <-> device, and device <-> pinned memory in shared-memory mode: one command for a
  copy engine, asynchronous when stream-ordered (aclrtMemcpyAsync from pinned memory is
  truly asynchronous: one copy, no staging).
- pageable host memory (and everything in in-stream mode): through the session's staging
  area in chunks, two in flight, the call returning once the last chunk has landed (as
  CUDA does for pageable copies). In in-stream mode the chunks (IN_STREAM_CHUNK,
  IN_STREAM_DEPTH in flight) ride in the stream as the bulk bytes of the request's or the
  reply's message (simnpu.proto.bulk), read from or written to the caller's memory
  directly; the daemon takes them where they go (server/control/handlers/copy_calls.py).
- host <-> host: memmove in this process.

Pageable host memory is checked before this process touches it (hostmem.check_pageable:
one system call per pageable pointer of a call), so that a bad host pointer is 107000, not
a segmentation fault. Pinned memory is this process's own mapping and is not checked again;
neither is anything on the path of an asynchronous copy from pinned memory.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import TYPE_CHECKING

from simnpu.client.hostmem import DEVICE, PAGEABLE, PINNED, check_pageable
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.bulk import BulkReply
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.devices import Devices
    from simnpu.client.runtime.shared import Shared
    from simnpu.shm.region import Region

_KIND_SIDES = {  # kind -> (src is device, dst is device)
    codes.ACL_MEMCPY_HOST_TO_HOST: (False, False),
    codes.ACL_MEMCPY_HOST_TO_DEVICE: (False, True),
    codes.ACL_MEMCPY_DEVICE_TO_HOST: (True, False),
    codes.ACL_MEMCPY_DEVICE_TO_DEVICE: (True, True),
    codes.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: (False, True),
    codes.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: (True, True),
    codes.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: (True, True),
}
# Each in-stream chunk costs a message and its handling on both sides, whatever its size:
# 8 MiB chunks moved about 1.7x the bytes per second of 1 MiB ones (1, 2, 4, 8, 16 MiB tried)
IN_STREAM_CHUNK = 8 << 20
IN_STREAM_DEPTH = 4  # in flight at most: the default staging area's 32 MiB


class CopyPaths:
    """The copies and fills of one session (the memory part's: client/runtime/memory.py),
    with what deciding their path needs: what the parts share (the pinned blocks, the
    allocation index, the contexts, the capture modes) and peer access
    (client/runtime/devices.py). Every call is given the call site of the public call it
    serves."""

    def __init__(self, shared: Shared, staging: Region | None, staging_bytes: int, peers: Devices):
        self._connection, self._contexts = shared.connection, shared.contexts
        self._host, self._allocations = shared.host, shared.allocations
        self._capture_modes = shared.capture_modes
        self._peers = peers
        self.staging = staging
        self.shared = staging is not None
        self.staging_address = staging.address() if staging is not None else 0
        if self.shared:  # two halves: this process fills one while the daemon drains the other
            self.slot, self.depth = staging_bytes // 2, 2
        else:  # the daemon fills the slots from the stream: keep several chunks in flight
            self.slot = min(IN_STREAM_CHUNK, staging_bytes // 2)
            self.depth = min(IN_STREAM_DEPTH, staging_bytes // self.slot)
        self._staging_lock = threading.Lock()  # one staged copy at a time: they share the area

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()
            self.staging = None

    # ---- checks ---------------------------------------------------------------------------
    def _side(self, address: int, count: int) -> str:
        side = self._host.classify(address)
        if side == DEVICE:
            self._allocations.device_range(address, count)
        elif side == PINNED:
            block = self._host.find(address)
            assert block is not None  # classified as pinned
            if address + count > block.address + block.size:
                raise invalid(
                    f"{count} bytes at {address:#x} run past the end of pinned memory "
                    f"[{block.address:#x}, +{block.size})"
                )
            if not self.shared:
                side = PAGEABLE
        return side

    def _location(self, address: int, side: str) -> commands.Location:
        if side == DEVICE:
            return commands.Location(commands.SPACE_DEVICE, 0, address)
        block = self._host.find(address)
        assert block is not None  # classified as pinned
        return commands.Location(commands.SPACE_PINNED, block.handle, address - block.address)

    # ---- memcpy ---------------------------------------------------------------------------
    def copy(
        self,
        stream: int | None,
        site: str,
        dst: int,
        dest_max: int,
        src: int,
        count: int,
        kind: int,
    ) -> None:
        """On `stream`, aclrtMemcpyAsync (None: aclrtMemcpy), for the public call at `site`."""
        if not dst or not src:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to memcpy")
        if count < 0 or dest_max < 0:
            raise invalid("negative size passed to memcpy")
        if count > dest_max:
            raise invalid(f"count {count} exceeds destMax {dest_max}")
        if kind != codes.ACL_MEMCPY_DEFAULT and kind not in _KIND_SIDES:
            raise invalid(f"unknown memcpy kind {kind}")
        if count == 0:
            return
        src_side, dst_side = self._side(src, count), self._side(dst, count)
        if kind != codes.ACL_MEMCPY_DEFAULT:
            expected = _KIND_SIDES[kind]
            actual = (src_side == DEVICE, dst_side == DEVICE)
            if expected != actual:
                raise invalid(
                    f"memcpy kind {kind} does not match the pointers: source is "
                    f"{src_side} memory, destination is {dst_side} memory"
                )
        if src_side == DEVICE and dst_side == DEVICE:
            self._peers.check_peer_copy(src, dst, self._running_device(dst, stream))
        if src_side == PAGEABLE:
            check_pageable(src, count, False, "src")
        if dst_side == PAGEABLE:
            check_pageable(dst, count, True, "dst")
        if src_side != DEVICE and dst_side != DEVICE:
            if stream is not None:
                raise NpuError(
                    codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                    "asynchronous host-to-host copies are not supported in ACL_HOST run mode",
                )
            ctypes.memmove(dst, src, count)
            return
        if PAGEABLE in (src_side, dst_side):
            if stream is not None:  # the runtime makes it synchronous: capture modes apply
                if self._contexts.streams[stream].bound_model:
                    raise NpuError(
                        codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                        "a copy through pageable host memory cannot be recorded into a model "
                        "in simnpu: copy from pinned host memory (acl.rt.malloc_host)",
                    )
                if self._capture_modes.capturing(stream):
                    raise invalid("a copy through pageable host memory cannot be captured")
                self._capture_modes.check(
                    "an asynchronous copy through pageable host memory",
                    codes.ACL_ERROR_RT_CAPTURE_MODE_BLOCK_ASYNC,
                )
            self._staged(dst, dst_side, src, count, stream, site)
            return
        dst_loc, src_loc = self._location(dst, dst_side), self._location(src, src_side)
        if stream is None:
            request = pb.MemcpyRequest(dst=_message(dst_loc), src=_message(src_loc), count=count)
            self._connection.call(request, site)
        else:
            self._connection.send_command(
                commands.Copy.pack(stream, dst_loc, src_loc, count), site, stream
            )

    def _running_device(self, dst: int, stream: int | None) -> int:
        """The device a device-to-device copy runs on: its stream's; for aclrtMemcpy the
        current context's (the destination's when the thread has none)."""
        if stream is not None:
            return self._contexts.streams[stream].context.device
        context = self._contexts.current_or_none()
        return self._peers.device_of(dst) if context is None else context.device

    def _staged(self, dst, dst_side, src, count, stream, site: str) -> None:
        """Chunks through the staging area, `depth` in flight (one per slot of it). Blocks."""
        with self._staging_lock:
            self._staged_locked(dst, dst_side, src, count, stream, site)

    def _staged_locked(self, dst, dst_side, src, count, stream, site: str) -> None:
        inline = not self.shared
        to_device = dst_side == DEVICE
        in_flight: collections.deque = collections.deque()
        for index, offset in enumerate(range(0, count, self.slot)):
            size = min(self.slot, count - offset)
            slot = (index % self.depth) * self.slot
            if len(in_flight) == self.depth:
                self._land(in_flight.popleft())
            staging = pb.Location(space=commands.SPACE_STAGING, offset=slot)
            if to_device:
                chunk = None
                if self.shared:
                    ctypes.memmove(self.staging_address + slot, src + offset, size)
                else:  # read when the message is sent: this call returns only after that
                    chunk = (ctypes.c_char * size).from_address(src + offset)
                request = pb.MemcpyRequest(
                    dst=_message(self._location(dst + offset, DEVICE)),
                    src=staging,
                    count=size,
                    stream=stream,
                    inline=inline,
                )
                pending = self._connection.request_async(request, site, bulk=chunk)
                in_flight.append((pending, None, 0, 0))
            else:
                request = pb.MemcpyRequest(
                    dst=staging,
                    src=_message(self._location(src + offset, DEVICE)),
                    count=size,
                    stream=stream,
                    inline=inline,
                )
                pending = self._connection.request_async(request, site)
                in_flight.append((pending, dst + offset, slot, size))
        while in_flight:
            self._land(in_flight.popleft())

    def _land(self, entry) -> None:
        pending, destination, slot, size = entry
        reply = self._connection.wait(pending)
        if destination is not None:
            if self.shared:
                ctypes.memmove(destination, self.staging_address + slot, size)
            else:  # the reply's bulk bytes, a view into the received message
                import numpy as np  # only in-stream copies need it: not on a first call's path

                assert isinstance(reply, BulkReply)  # an in-stream chunk's reply carries it
                data = np.frombuffer(reply.bulk, np.uint8)
                if data.nbytes != size:
                    raise NpuError(
                        codes.ACL_ERROR_RT_INTERNAL_ERROR,
                        f"the daemon sent {data.nbytes} bytes of a {size}-byte chunk",
                    )
                ctypes.memmove(destination, data.ctypes.data, size)

    # ---- memset ---------------------------------------------------------------------------
    def fill(
        self, dst: int, dest_max: int, value: int, count: int, stream: int | None, site: str
    ) -> None:
        """aclrtMemset (stream None) or aclrtMemsetAsync: host or device decided by address,
        for the public call at `site`."""
        if not dst:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to memset")
        if count < 0 or dest_max < 0:
            raise invalid("negative size passed to memset")
        if count > dest_max:
            raise invalid(f"count {count} exceeds destMax {dest_max}")
        if count == 0:
            return
        side = self._side(dst, count)
        if side == PAGEABLE or (side == PINNED and stream is None):
            # At once, on the host. Stream order still holds for pageable memory: no task
            # of a stream touches it after its copy call has returned.
            if side == PAGEABLE:
                check_pageable(dst, count, True, "devPtr")
            ctypes.memset(dst, value & 0xFF, count)
            return
        location = self._location(
            dst, side
        )  # device memory, or pinned memory filled in stream order
        if stream is None:
            request = pb.MemsetRequest(dst=_message(location), value=value & 0xFF, count=count)
            self._connection.call(request, site)
        else:
            self._connection.send_command(
                commands.Memset.pack(stream, location, value & 0xFF, count), site, stream
            )


def _message(location: commands.Location) -> pb.Location:
    """A record's location as a request's."""
    return pb.Location(space=location.space, id=location.id, offset=location.offset)
