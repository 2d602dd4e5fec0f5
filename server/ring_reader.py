"""The daemon's end of a session's submission ring (docs/fast-path.md): one thread that
takes what the client wrote and hands it to the session, in order.

Started by OP_USE_RING. From then on the session's gRPC reader only feeds `stream_items`:
requests too big for the ring, which the ring marks with CMD_RING_STREAM_ITEM at their
place in the order. Stopped (and joined) when the session ends.
"""

from __future__ import annotations

import logging
import queue
import threading

from simnpu.shm.region import Region
from simnpu.shm.ring import RingCorrupt, SubmissionRing

log = logging.getLogger("simnpu.ring")

_NAP_S = 1.0  # an idle ring thread re-checks whether its session ended this often
_STOP = object()


class RingReader:
    def __init__(self, session, region: Region):
        self.session = session
        self.region = region
        self.ring = SubmissionRing(region.map)
        self.stream_items: queue.SimpleQueue = queue.SimpleQueue()  # Items from the gRPC stream
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"simnpu-ring-{session.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def next_stream_item(self):
        """The next Item the client sent by the stream (blocks); None once the session ends."""
        item = self.stream_items.get()
        return None if item is _STOP else item

    def stop(self) -> None:
        """End the thread; what it has not taken is dropped. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        self.stream_items.put(_STOP)
        self.ring.wake_consumer()
        if threading.current_thread() is not self._thread:
            self._thread.join(30)
        self.ring.release()

    def _run(self) -> None:
        ring = self.ring
        while not self._stopping:
            try:
                pieces = ring.take()
                if pieces:
                    self.session.handle_ring(pieces)
                else:
                    ring.sleep(_NAP_S)
            except RingCorrupt as error:  # the client broke the protocol
                log.error("%r: %s; ending the session", self.session, error)
                self.session.abandon(f"its submission ring is corrupt ({error})")
                return
            except Exception:  # a bug of ours: the session cannot go on in order
                log.exception("%r: handling its submission ring failed", self.session)
                self.session.abandon("the daemon failed to handle its submission ring")
                return
