"""How a request's reply reaches the thread waiting for it (the client end of a session,
client/transport.py, sends the requests).

A request waits as a `Pending`. Its reply comes either through the session stream, which
one thread at a time reads (`ReaderRole`: a waiting thread reads it itself, so the reply
wakes that very thread), or, with shared memory (docs/fast-path.md), through a mailbox slot
of the session's notify area (`Mailbox`), polled for a while, then slept on with the
doorbell's futex. A session stream that fails becomes the NpuError every waiter gets
(`describe_rpc_error`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from simnpu.client import fast_path
from simnpu.proto import codes, npu_pb2
from simnpu.proto.errors import NpuError
from simnpu.shm import notify as notify_layout

if TYPE_CHECKING:
    import grpc

_MAILBOX_SLICE_S = 0.1  # a mailbox waiter re-checks for a broken session this often


class Pending:
    """A request waiting for its reply."""

    __slots__ = ("event", "reply", "seq", "slot")

    def __init__(self, seq: int = 0, slot: int = -1):
        self.event = threading.Event()  # set when the reply came by the stream (or never will)
        self.reply: npu_pb2.Reply | NpuError | None = None
        self.seq = seq
        self.slot = slot  # its mailbox slot in the notify area, or -1


class Mailbox:
    """The session's mailbox slots in its notify area (docs/fast-path.md): the reply to a
    request sent with a slot comes there while its caller sleeps on the doorbell."""

    __slots__ = ("area", "free", "long_wait", "replies")

    def __init__(self, area: notify_layout.NotifyArea):
        self.area = area
        self.free = list(range(notify_layout.MAILBOX_SLOTS))  # slots no request holds
        self.replies = 0  # how many replies came through the mailbox (a statistic)
        self.long_wait = False  # the last wait for a reply outlasted fast_path.POLL_S

    def wait(self, pending: Pending, lock: threading.Lock, replies: dict[int, Pending]) -> None:
        """Wait until the reply is in the pending request's slot (then it is pending.reply,
        and it leaves `replies`, the connection's table, under its `lock`), or it went by
        the stream, or the session broke: polling the slot for fast_path.POLL_S (not after
        a wait that outlasted it), yielding the CPU between looks, as a synchronize polls
        its signal, then sleeping on the doorbell. The slot is free again afterwards."""
        slot, area = pending.slot, self.area
        started = time.monotonic()
        polled_until = started if self.long_wait else started + fast_path.POLL_S
        try:
            while not pending.event.is_set():
                seen = area.doorbell()
                payload = area.take_reply(slot, pending.seq)
                if payload is notify_layout.OVERFLOW:
                    return  # the reply comes by the stream: the caller reads it there
                if payload is not None:
                    try:
                        reply = npu_pb2.Reply.FromString(payload)
                    except DecodeError:  # seen half-written: the doorbell moves once it is whole
                        reply = None
                    if reply is not None and reply.id == pending.seq:
                        with lock:
                            replies.pop(pending.seq, None)
                            self.replies += 1
                        pending.reply = reply
                        pending.event.set()
                        return
                if time.monotonic() < polled_until:
                    os.sched_yield()
                else:
                    area.wait_doorbell(seen, _MAILBOX_SLICE_S)
        finally:
            with lock:
                self.free.append(slot)
            pending.slot = -1
            self.long_wait = time.monotonic() - started > fast_path.POLL_S


class ReaderRole:
    """Who reads the session stream. A thread waiting for a reply reads it itself (the reply
    wakes that very thread, no hand-off); others wait for the reader to pass their reply on.
    The background receiver reads only when notices must arrive with nobody waiting (host
    callbacks), when replies come through the mailbox, or while the session closes."""

    __slots__ = ("_changed", "busy", "notices_due")

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.busy = False  # a thread is reading the stream
        self.notices_due = 0  # host callbacks queued and not yet announced by the daemon

    def claim_for(self, pending: Pending) -> bool:
        """Wait until the role is free or `pending` is answered; True: the caller reads now."""
        with self._changed:
            while self.busy and not pending.event.is_set():
                self._changed.wait()
            if pending.event.is_set():
                return False
            self.busy = True
            return True

    def claim_in_background(self, over: Callable[[], bool], always: Callable[[], bool]) -> bool:
        """Wait until the background receiver must read (True: it reads now) or the session
        is `over` (False). `always`: the stream is read even with no notice due."""
        with self._changed:
            while not over() and (self.busy or not (self.notices_due > 0 or always())):
                self._changed.wait()
            if over():
                return False
            self.busy = True
            return True

    def release(self) -> None:
        with self._changed:
            self.busy = False
            self._changed.notify_all()

    def expect_notice(self, count: int = 1) -> None:
        with self._changed:
            self.notices_due += count
            self._changed.notify_all()

    def notice_arrived(self) -> None:
        with self._changed:
            self.notices_due -= 1

    def wake(self) -> None:
        """Everyone waiting looks at the session again (it broke, closes, or changed)."""
        with self._changed:
            self._changed.notify_all()


def describe_rpc_error(address: str, error: grpc.RpcError) -> tuple[int, str]:
    """The ACL code and message a failed session stream becomes."""
    import grpc  # (imported by the transport first: client/config.py's prefer_fast_grpc)

    status = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    if status == grpc.StatusCode.UNAUTHENTICATED:
        return (
            codes.ACL_ERROR_RT_NO_PERMISSION,
            f"the simnpu daemon at {address} refused this client: {details}",
        )
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, f"the simnpu daemon at {address}: {details}"
    return codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR, f"lost the simnpu daemon at {address}: {details}"


def write_device_output(text: str) -> None:
    """Device printf output (ctx.printf, print in a kernel module) to this process's stdout,
    as the runtime prints it when a synchronize flushes the device's printf buffers."""
    sys.stdout.write(text)
    sys.stdout.flush()
