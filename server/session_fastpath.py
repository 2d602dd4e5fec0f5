"""A session's shared-memory fast path, daemon side (docs/fast-path.md): its submission
ring in, and out its notify area -- replies put in the client's mailbox slots, stream words
written when streams drain, and the items that let a worker write them instead.

A mixin of `Session` (server/session.py); the layouts are simnpu.shm.ring and
simnpu.shm.notify. `handle_ring` is the ring thread's work (server/ring_reader.py); the rest
is cheap and non-blocking, on the session's reader or ring thread (replies) and under the
scheduler lock (stream words).
"""

from __future__ import annotations

import threading

from google.protobuf.message import DecodeError
from simnpu.proto import codes, commands, npu_pb2
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.ring_reader import RingReader
from simnpu.shm import futex
from simnpu.shm import notify as layout
from simnpu.shm import ring as ring_layout
from simnpu.shm.region import Region, segment_name, shm_available_bytes
from simnpu.shm.ring import RingCorrupt

_RING_BATCH = 1024  # scheduler work posted at most this many calls at a time from a ring


class SessionFastPath:
    def _init_fast_path(self) -> None:
        self.notify: layout.NotifyArea | None = None
        self.notify_region: Region | None = None
        self.ring_region: Region | None = None
        self.ring_reader: RingReader | None = None  # running once the client asked (OP_USE_RING)
        self.ring_site: str | None = None  # call site of the calls in the ring, when observed
        self._notify_lock = threading.Lock()  # mailbox writes come from several threads
        self._mailbox_of: dict[int, int] = {}  # request id -> mailbox slot its reply goes to
        self._free_stream_slots = list(range(layout.STREAM_SLOTS - 1, -1, -1))

    def _create_fast_path(self) -> list[str]:
        """Create the notify and ring segments (at HELLO, once); their names, "" for none
        (no futexes here; no room in /dev/shm for the ring, whose pages are allocated now)."""
        if self.notify_region is None and futex.AVAILABLE:
            self.notify_region = Region.create(segment_name(f"s{self.id}", "notify"), layout.SIZE)
            self.notify = layout.NotifyArea(self.notify_region.map)
            if shm_available_bytes() > 4 * ring_layout.SIZE:
                try:
                    self.ring_region = Region.create(segment_name(f"s{self.id}", "ring"), ring_layout.SIZE,
                                                     reserve=True)
                except OSError:  # /dev/shm filled up meanwhile: calls go by the stream
                    self.ring_region = None
        return [region.name if region is not None else "" for region in (self.notify_region, self.ring_region)]

    def _release_fast_path(self) -> None:
        self._stop_ring()
        with self._notify_lock:
            area, self.notify = self.notify, None
            self._mailbox_of.clear()
        if area is not None:
            area.release()
            self._release_segment(self.notify_region)
            self.notify_region = None
        if self.ring_region is not None:
            self._release_segment(self.ring_region)
            self.ring_region = None

    # ---- the submission ring ----------------------------------------------------------------
    def _use_ring(self, request):
        """OP_USE_RING: later calls come through the ring (this reply goes out the usual way)."""
        if self.ring_region is None:
            raise NpuError(codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "this session has no submission ring")
        if self.ring_reader is None:
            self.ring_reader = RingReader(self, self.ring_region)
            self.ring_reader.start()
        return []

    def handle_ring(self, pieces: list) -> None:
        """Execute what the client wrote in its submission ring, in order (ring thread).
        A malformed record ends the session: nothing after it can be found any more."""
        observer = self.daemon.observer
        if observer is not None:  # forget the call sites of what was submitted before
            observer.sites(self, (), ())
        for piece in pieces:
            try:
                for command in commands.decode(piece, ring=True):
                    kind = type(command)
                    if kind is commands.RingSite:  # this call's and the following calls'
                        self.ring_site = command.site if observer is not None else None
                        continue
                    if observer is not None and self.ring_site is not None:
                        observer.site(self, self.seq + 1, self.ring_site)
                    if kind is commands.RingRequest:
                        self._handle_ring_request(command.request)
                    elif kind is commands.StreamItem:
                        self._flush()  # what came before does not wait for the stream
                        item = self.ring_reader.next_stream_item()
                        if item is None:  # the session ended
                            return
                        self._handle_item(item)
                    else:
                        self._handle_command(command)
                        if len(self._batch) >= _RING_BATCH:  # the device starts on these while
                            self._flush()                    # the rest is decoded
            except NpuError as error:  # commands.decode: handlers report their own errors
                self._flush()
                raise RingCorrupt(error.message) from None
        self._flush()

    def _handle_ring_request(self, payload: bytes) -> None:
        try:
            request = npu_pb2.Request.FromString(payload)
        except DecodeError:
            self.seq += 1  # it took a sequence number on the client
            self._defer_failure(invalid("a request in the submission ring does not parse"))
            return
        self._handle_request(request)

    def _stop_ring(self) -> None:
        """The session ends: no more calls are taken from the ring. Idempotent."""
        if self.ring_reader is not None:
            self.ring_reader.stop()

    # ---- replies ------------------------------------------------------------------------------
    def _note_mailbox(self, request) -> None:
        """Remember where request `request`'s reply goes (it asked for a mailbox slot), if
        the slot is valid and a reply is due."""
        if request.id and request.mailbox <= layout.MAILBOX_SLOTS and self.notify is not None:
            self._mailbox_of[request.id] = request.mailbox - 1

    def _post_reply(self, reply) -> bool:
        """Put `reply` in its mailbox slot; False if it must go by the stream (no slot asked,
        or too big: the slot then tells the client so)."""
        slot = self._mailbox_of.pop(reply.id, None)
        if slot is None:
            return False
        with self._notify_lock:
            area = self.notify
            return area is not None and area.post_reply(slot, reply.id, reply.SerializeToString())

    # ---- stream words -------------------------------------------------------------------------
    def _take_stream_slot(self) -> int:
        return self._free_stream_slots.pop() if self.notify is not None and self._free_stream_slots else -1

    def release_stream_slot(self, stream) -> None:
        """The stream is gone and nothing of it runs any more: its word may be reused."""
        if stream.notify_slot >= 0:
            self._free_stream_slots.append(stream.notify_slot)
            stream.notify_slot = -1

    def failure_pending(self, stream) -> bool:
        """Would a synchronize of `stream` report a failure now? (what _take_failure takes)"""
        return (self.submit_failure is not None or stream.failure is not None
                or stream.context.failure is not None)

    def stream_drained(self, stream, seq: int) -> None:
        """Scheduler: `stream` ran (or dropped) everything up to `seq` and has nothing queued."""
        area = self.notify
        if area is not None and stream.notify_slot >= 0:
            # never below what was written before: a rejected call may have been claimed done
            seq = stream.word_seq = max(stream.word_seq, seq)
            dirty = self.failure_pending(stream)
            if area.word(stream.notify_slot) != (seq | layout.DIRTY if dirty else seq):
                area.set_done(stream.notify_slot, seq, dirty)  # (else a worker wrote it already)

    def word_says(self, stream, seq: int) -> bool:
        """Does `stream`'s word hold exactly what a worker writes for task `seq`?"""
        area = self.notify
        return area is not None and area.word(stream.notify_slot) == seq

    def rejected(self, seq: int) -> None:
        """Scheduler, in submission order: asynchronous call `seq` was rejected. Its stream
        may be the one the client sleeps on, waiting for `seq` that will never run: every
        stream word says "done up to `seq`, ask the daemon" (which waits and reports)."""
        area = self.notify
        if area is None:
            return
        for context in self.contexts:
            for stream in context.streams:
                if stream.notify_slot >= 0:
                    stream.word_seq = max(stream.word_seq, seq)
                    area.set_done(stream.notify_slot, stream.word_seq, True)

    def notify_item(self, stream, seq: int) -> tuple | None:
        """Scheduler, at dispatch of a stream that has a word: the work item that has the
        worker write it once a batch ending with task `seq` (the stream's tail) succeeded;
        None when the word must come from the scheduler (a failure to report, STOP mode, an
        observed session)."""
        if (self.notify is None or self.daemon.observer is not None
                or stream.context.failure_mode != codes.ACL_CONTINUE_ON_FAILURE
                or stream.tasks[-1].seq != seq or self.failure_pending(stream)):
            return None
        return ("notify", self.notify_region.name, stream.notify_slot, seq)
