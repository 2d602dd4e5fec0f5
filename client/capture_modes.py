"""Which calls the capture modes refuse in this process: the streams it began captures on,
with their mode and thread, and each thread's exchange mode
(aclmdlRICaptureThreadExchangeMode). Mirrors the runtime's Context::IsCaptureModeSupport
(docs/graph-capture.md): with the calling thread's exchange mode RELAXED nothing is refused;
GLOBAL refuses while a capture of the process was begun in GLOBAL mode or this thread began
one in THREAD_LOCAL mode; THREAD_LOCAL refuses while this thread began one in GLOBAL or
THREAD_LOCAL mode.
"""

from __future__ import annotations

import threading

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

GLOBAL = codes.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL
THREAD_LOCAL = codes.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL
RELAXED = codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED
MODES = (GLOBAL, THREAD_LOCAL, RELAXED)
_NAMES = {GLOBAL: "GLOBAL", THREAD_LOCAL: "THREAD_LOCAL", RELAXED: "RELAXED"}


class CaptureModes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()  # .mode: the thread's exchange mode (GLOBAL at first)
        self._captures: dict[int, tuple[int, int]] = {}  # origin stream -> (mode, thread)

    def exchange(self, mode: int) -> int:
        """aclmdlRICaptureThreadExchangeMode: set this thread's mode, return the old one."""
        old = getattr(self._local, "mode", GLOBAL)
        self._local.mode = mode
        return old

    def begun(self, stream: int, mode: int) -> None:
        with self._lock:
            self._captures[stream] = (mode, threading.get_ident())

    def ended(self, stream: int) -> None:
        with self._lock:
            self._captures.pop(stream, None)

    def capturing(self, stream: int) -> bool:
        """Whether this process began a capture on `stream` that has not ended."""
        with self._lock:
            return stream in self._captures

    def wrong_thread(self, stream: int) -> bool:
        """Whether ending the capture of `stream` from this thread is refused (107038): it
        was begun in another thread in a mode other than RELAXED."""
        with self._lock:
            begun = self._captures.get(stream)
        return begun is not None and begun[0] != RELAXED and begun[1] != threading.get_ident()

    def check(self, call: str, code: int = codes.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT) -> None:
        """Refuse `call`, which would run at once, with `code` if the modes say so."""
        with self._lock:
            captures = list(self._captures.values())
        if not captures:
            return
        exchange = getattr(self._local, "mode", GLOBAL)
        if exchange == RELAXED:
            return
        me = threading.get_ident()
        mine = {mode for mode, thread in captures if thread == me}
        if exchange == GLOBAL:
            refused = any(mode == GLOBAL for mode, _ in captures) or THREAD_LOCAL in mine
        else:
            refused = bool(mine & {GLOBAL, THREAD_LOCAL})
        if refused:
            modes = ", ".join(sorted({_NAMES[mode] for mode, _ in captures}))
            raise NpuError(
                code,
                f"{call} is refused while a stream is being captured (capture modes: {modes}; "
                f"this thread's mode: {_NAMES[exchange]}); aclmdlRICaptureThreadExchangeMode "
                "with ACL_MODEL_RI_CAPTURE_MODE_RELAXED allows it in this thread",
            )
