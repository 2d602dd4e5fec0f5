"""A session's shared-memory fast path, daemon side (docs/fast-path.md): its submission ring
in; out, its notify area -- replies put in the client's mailbox slots, and the completion
signals of its streams (simnpu.shm.notify).

The segments are made at HELLO. Once the client sends UseRingRequest a ring thread takes
what the client writes in its ring and hands it to the session in order; from then on the
session's gRPC reader only queues the stream items the ring marks (requests too big for
it). The layouts are simnpu.shm.ring and simnpu.shm.notify.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

from simnpu.proto import codes, npu_pb2
from simnpu.proto.errors import NpuError
from simnpu.server.core.untrusted import escaped
from simnpu.shm import futex
from simnpu.shm import notify as layout
from simnpu.shm import ring as ring_layout
from simnpu.shm.region import Region, segment_name, shm_available_bytes
from simnpu.shm.ring import RingCorrupt, SubmissionRing

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

log = logging.getLogger("simnpu.ring")

_NAP_S = 1.0  # an idle ring thread re-checks whether its session ended this often
# How long a request the ring marks may take to arrive by the gRPC stream. The client queues
# it for sending as it writes the marker, so only its transfer is awaited: the largest
# message (256 MiB) takes about 3 s on a 2-vCPU machine. A client still silent after this
# marked a request it never sent.
STREAM_ITEM_WAIT_S = 30.0
_STOP = object()


class FastPath:
    def __init__(self, session: Session):
        self.session = session
        self.notify: layout.NotifyArea | None = None
        self.notify_region: Region | None = None
        self.ring_region: Region | None = None
        self.reader: RingReader | None = None  # running once the client asked for it
        self._lock = threading.Lock()  # mailbox writes come from several threads
        self._mailbox_of: dict[int, int] = {}  # request id -> the mailbox slot its reply goes to

    def create(self) -> tuple[str, str]:
        """Make the notify and ring segments (at HELLO, once); their names, "" for none (no
        futexes here; no room in /dev/shm for the ring, whose pages are allocated now)."""
        session = self.session
        if self.notify_region is None and futex.AVAILABLE:
            self.notify_region = Region.create(
                segment_name(f"s{session.id}", "notify"), layout.SIZE
            )
            self.notify = layout.NotifyArea(self.notify_region.map, self.notify_region.name)
            session.owner.signals = self.notify
            if shm_available_bytes() > 4 * ring_layout.SIZE:
                try:
                    self.ring_region = Region.create(
                        segment_name(f"s{session.id}", "ring"), ring_layout.SIZE, reserve=True
                    )
                except OSError:  # /dev/shm filled up meanwhile: calls go by the stream
                    self.ring_region = None
        notify, ring = self.notify_region, self.ring_region
        return (notify.name if notify else "", ring.name if ring else "")

    def release(self) -> None:
        """The session ends: unlink the segments."""
        self.stop_ring()
        with self._lock:
            area, self.notify = self.notify, None
            self._mailbox_of.clear()
        self.session.owner.signals = None
        if area is not None:
            area.release()
        if self.notify_region is not None:
            self.session.release_segment(self.notify_region)
            self.notify_region = None
        if self.ring_region is not None:
            self.session.release_segment(self.ring_region)
            self.ring_region = None

    # ---- the submission ring -------------------------------------------------------------------
    def use_ring(self) -> None:
        """UseRingRequest: later calls come through the ring."""
        if self.ring_region is None:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "this session has no submission ring"
            )
        if self.reader is None:
            self.reader = RingReader(self.session, self.ring_region)
            self.reader.start()

    def takes_stream_items(self, items) -> bool:
        """With the ring in use, the stream's items are requests the ring marks: the ring
        thread takes them in its order. False when the session reads its stream itself."""
        if self.reader is None:
            return False
        for item in items:
            self.reader.stream_items.put(item)
        return True

    def stop_ring(self) -> None:
        """The session ends: nothing more is taken from the ring. Idempotent."""
        if self.reader is not None:
            self.reader.stop()

    # ---- replies ------------------------------------------------------------------------------
    def note_mailbox(self, request: npu_pb2.Request) -> None:
        """Remember where the reply to `request` goes (it asked for a mailbox slot), if the
        slot is valid and a reply is due."""
        if request.id and request.mailbox <= layout.MAILBOX_SLOTS and self.notify is not None:
            self._mailbox_of[request.id] = request.mailbox - 1

    def post_reply(self, reply: npu_pb2.Reply) -> bool:
        """Put `reply` in its mailbox slot; False if it must go by the stream (no slot asked,
        or too big: the slot then tells the client so)."""
        if not self._mailbox_of:
            return False
        slot = self._mailbox_of.pop(reply.id, None)
        if slot is None:
            return False
        with self._lock:
            area = self.notify
            return area is not None and area.post_reply(slot, reply.id, reply.SerializeToString())


class RingReader:
    """The thread that takes what the client wrote in its submission ring, in order."""

    def __init__(self, session: Session, region: Region):
        self.session = session
        self.ring = SubmissionRing(region.map)
        self.stream_items: queue.SimpleQueue = queue.SimpleQueue()  # Items from the gRPC stream
        self._stopping = False
        self._stop_lock = threading.Lock()
        self._stopped = threading.Event()  # set once stop() has released the ring's views
        self._thread = threading.Thread(
            target=self._run, name=f"simnpu-ring-{session.id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _next_stream_item(self) -> npu_pb2.Item | None:
        """The next Item of the gRPC stream (blocks, up to STREAM_ITEM_WAIT_S); None once
        the session ended. RingCorrupt if it does not come."""
        try:
            item = self.stream_items.get(timeout=STREAM_ITEM_WAIT_S)
        except queue.Empty:
            raise RingCorrupt(
                "it marks a request sent by the stream that did not arrive within "
                f"{STREAM_ITEM_WAIT_S:.0f} s"
            ) from None
        return None if item is _STOP else item

    def stop(self) -> None:
        """End the thread; what it has not taken is dropped. Idempotent: a second caller
        returns once the first is done (the ring's views are gone, its segment may be
        closed), but for the ring thread itself. Blocks."""
        with self._stop_lock:
            first, self._stopping = not self._stopping, True
        if not first:
            if threading.current_thread() is not self._thread:
                self._stopped.wait()
            return
        try:
            self.stream_items.put(_STOP)
            self.ring.wake_consumer()
            if threading.current_thread() is not self._thread:
                self._thread.join(30)
            self.ring.release()
        finally:
            self._stopped.set()

    def _run(self) -> None:
        ring, session = self.ring, self.session
        while not self._stopping:
            try:
                pieces = ring.take()
                if pieces:
                    session.handle_ring(pieces, self._next_stream_item)
                else:
                    ring.sleep(_NAP_S)
            except RingCorrupt as error:  # the client broke the protocol
                session.owner.lines.warning(
                    log, "%r: %s; ending the session", session, escaped(error)
                )
                session.abandon(f"its submission ring is corrupt ({error})")
                return
            except Exception:  # a bug of ours: the session cannot go on in order
                session.owner.lines.exception(
                    log, "%r: handling its submission ring failed", session
                )
                session.abandon("the daemon failed to handle its submission ring")
                return
