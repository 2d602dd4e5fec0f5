"""The daemon's end of one kernel process's socket: reads and sends that never block.

A kernel process is untrusted once it has run a kernel (docs/kernel-isolation.md): whatever
it writes on its socket, or leaves half written, or however long it stops reading, the
daemon's thread that reads or sends must go on. The kernel process keeps a plain
multiprocessing `Connection` (server/units/runner.py, `serve_batches`), so a frame is what
`Connection.send_bytes` writes: a big-endian signed 4-byte length (`"!i"`), or -1 and an
unsigned 8-byte length (`"!Q"`), then that many bytes of payload. What this channel sends is
pickled and framed the same way, so the kernel process's `Connection.recv` reads it.

Why it never blocks:

- The socket is non-blocking and every read and write also passes MSG_DONTWAIT: a read
  takes what the socket holds now, a write puts in what fits now, neither waits.
- What is read is kept in this channel's buffer until a frame is whole. A frame begun and
  never finished costs the reader nothing but the bytes kept; it stays unfinished until
  its owner gives up on the process (the operator timeout of the batch it runs).
- A header is judged as soon as it is whole, before any of its payload is read: a negative
  length (other than -1) or one over `max_frame` raises BadFrame, so the buffer never holds
  more than one header and one frame: `max_frame` + 12 bytes.
- One `receive` reads until a frame is whole or the socket is empty, so it reads at most
  the buffer's size; bytes left on the socket keep a level-triggered poll ready.
- What `send` cannot write now waits in this channel's outgoing queue (`pending`); its
  owner polls the socket for POLLOUT while anything waits and calls `flush` when it is
  writable (server/units/process_executor.py: only the scheduler thread polls).

A channel takes no lock: its owner serialises every call on it (the executor holds the
kernel processes' lock, which also orders `close` against reads and sends).
"""

from __future__ import annotations

import socket
import struct
from collections import deque
from multiprocessing.reduction import ForkingPickler

from simnpu.server.units.report_codec import MAX_REPORT, BadReport

_LENGTH = struct.Struct("!i")  # a frame's length, or -1: an 8-byte length follows
_LONG_LENGTH = struct.Struct("!Q")
_LONGEST_HEADER = _LENGTH.size + _LONG_LENGTH.size
_SHORT_LIMIT = 0x7FFFFFFF  # the longest frame a 4-byte length announces
_JOINED = 16 << 10  # a frame this short goes out with its header in one piece, as Connection's
_KEPT = 64 << 10  # the input buffer's size while no longer frame needs more
_FLAGS_IN = socket.MSG_DONTWAIT
_FLAGS_OUT = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


class BadFrame(BadReport):
    """The kernel process wrote a header no report may have: a negative length, or a longer
    frame than a report may be."""


class ReportChannel:
    """The daemon's end of a kernel process's socket `sock` (a connected Unix stream socket,
    owned by the channel from now on): `receive` the frames it wrote, each at most
    `max_frame` bytes; `send` it pickled messages. No call blocks."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_REPORT):
        sock.setblocking(False)
        self._sock = sock
        self._max_frame = max_frame
        self._in = bytearray(_KEPT)  # bytes read; those of frames not yet returned:
        self._start = 0  # from here
        self._end = 0  # to here
        self._out: deque[memoryview] = deque()  # what waits to be written, in order
        self._closed = False

    # ---- reading ----------------------------------------------------------------------------
    def receive(self) -> list[bytes]:
        """The frames made whole by what the socket holds now, in order (often none: a
        frame's rest has not come). Never blocks. Raises BadFrame for a header no report
        may have (the frames read with it are dropped: the process misbehaved), EOFError
        once the process has closed its end and every whole frame was returned (an
        unfinished one is dropped), OSError if the socket fails or the channel is closed."""
        if self._closed:
            raise OSError("the channel to the kernel process is closed")
        while True:
            frames = self._whole_frames()
            if frames:
                return frames
            room = self._room()
            try:
                count = self._sock.recv_into(room, len(room), _FLAGS_IN)
            except BlockingIOError:
                return []
            finally:
                room.release()
            if count == 0:
                raise EOFError("the kernel process closed its socket")
            self._end += count

    @property
    def unfinished(self) -> int:
        """Bytes read of a frame not yet whole (0: none is begun)."""
        return self._end - self._start

    def _header(self) -> tuple[int, int] | None:
        """(header length, payload length) of the frame at the buffer's start, or None while
        its header is not whole. Raises BadFrame for a length no report may have."""
        have = self._end - self._start
        if have < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._in, self._start)
        header = _LENGTH.size
        if length == -1:
            if have < _LONGEST_HEADER:
                return None
            (length,) = _LONG_LENGTH.unpack_from(self._in, self._start + header)
            header = _LONGEST_HEADER
        elif length < 0:
            raise BadFrame(f"a frame header with length {length}")
        if length > self._max_frame:
            raise BadFrame(f"a frame of {length} bytes (a report has at most {self._max_frame})")
        return header, length

    def _whole_frames(self) -> list[bytes]:
        """Take the whole frames off the buffer's start."""
        frames = []
        while True:
            sizes = self._header()
            if sizes is None:
                break
            header, length = sizes
            start = self._start + header
            if self._end < start + length:
                break
            frames.append(bytes(self._in[start : start + length]))
            self._start = start + length
        if self._start == self._end:  # nothing kept: start over, at the buffer's kept size
            self._start = self._end = 0
            if len(self._in) > _KEPT:
                self._in = bytearray(_KEPT)
        return frames

    def _room(self) -> memoryview:
        """Free space after the bytes kept, at least enough for the frame begun (its header,
        while that is not whole) to be whole: the kept bytes are moved to the buffer's
        start, and the buffer grows, when the frame would not fit."""
        sizes = self._header()
        need = _LONGEST_HEADER if sizes is None else sizes[0] + sizes[1]
        if self._start + need > len(self._in):
            kept = self._end - self._start
            self._in[:kept] = self._in[self._start : self._end]
            self._start, self._end = 0, kept
            if need > len(self._in):
                self._in.extend(bytes(need - len(self._in)))
        return memoryview(self._in)[self._end :]

    # ---- sending ----------------------------------------------------------------------------
    def send(self, message: object) -> bool:
        """Queue `message` for the kernel process, pickled and framed as `Connection.send`
        does, and write what the socket takes now. True: all that was queued is written;
        False: the rest waits (`pending`) for `flush`. Never blocks. Raises OSError if the
        channel is closed or the process's end is gone."""
        if self._closed:
            raise OSError("the channel to the kernel process is closed")
        data = memoryview(ForkingPickler.dumps(message))
        length = len(data)
        if length > _SHORT_LIMIT:
            self._out.append(memoryview(_LENGTH.pack(-1) + _LONG_LENGTH.pack(length)))
            self._out.append(data)
        elif length > _JOINED:
            self._out.append(memoryview(_LENGTH.pack(length)))
            self._out.append(data)
        else:
            self._out.append(memoryview(_LENGTH.pack(length) + data))
        return self.flush()

    def flush(self) -> bool:
        """Write what the socket takes now of what waits. True once nothing waits. Never
        blocks. Raises OSError if the channel is closed or the process's end is gone."""
        if self._closed:
            raise OSError("the channel to the kernel process is closed")
        out = self._out
        while out:
            try:
                sent = self._sock.send(out[0], _FLAGS_OUT)
            except BlockingIOError:
                return False
            if sent < len(out[0]):
                out[0] = out[0][sent:]
            else:
                out.popleft()
        return True

    @property
    def pending(self) -> bool:
        """Does anything sent wait to be written (the socket was full)?"""
        return bool(self._out)

    # ---- the socket -------------------------------------------------------------------------
    def fileno(self) -> int:
        """The socket's descriptor, to poll. Raises OSError once the channel is closed."""
        if self._closed:
            raise OSError("the channel to the kernel process is closed")
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the socket and drop what was read or waits to be written. Idempotent."""
        if not self._closed:
            self._closed = True
            self._sock.close()
            self._out.clear()
            self._in = bytearray()
            self._start = self._end = 0
