"""Exception-info callbacks (aclrtExceptionInfoCallbackRegister): what a failed task was.

When a call reports a task's failure (a synchronize, most often), the registered callbacks
run before that call returns, on a thread of their own, each with the handle of an
`ExceptionInfo` that the aclrtGet*FromExceptionInfo getters read; the handle is valid while
the callbacks run. The failing task is named by its sequence number, which is its task id
here (aclrtGetThreadLastTaskId); the client's call log says on which stream, from which
thread and with which record it was sent. Each failure is reported to the callbacks once.

The registry is the process's, as the CANN runtime's is: it outlives acl.finalize.
"""

from __future__ import annotations

import itertools
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simnpu.proto import commands

if TYPE_CHECKING:
    from simnpu.client.runtime.contexts import StreamRecord
    from simnpu.client.transport import CallLog
    from simnpu.proto.errors import NpuError

U32 = 0xFFFFFFFF  # a getter's value for a null or unknown info (ACL_ERROR_INVALID_EXCEPTION_INFO)


@dataclass(frozen=True)
class ExceptionInfo:
    """aclrtExceptionInfo: the failed task as the getters report it (uint32 values)."""

    task_id: int
    stream_id: int
    thread_id: int
    device_id: int
    error_code: int
    function: int  # the launched kernel's function handle; 0: not a launch
    args: tuple[int, int] | None  # (device address, size) of aclrtLaunchKernel's arguments


class ExceptionCallbacks:
    """The process's exception-info callbacks, the infos being reported, and the last kernel
    failure seen on each device (aclrtGetErrorVerbose)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[int], object]] = []  # in registration order
        self._legacy: Callable[[int], object] | None = None  # aclrtSetExceptionInfoCallback's
        self._infos: dict[int, ExceptionInfo] = {}  # handle -> info, while its callbacks run
        self._handles = itertools.count(1)
        self._reported: deque[tuple[int, int]] = deque(maxlen=256)  # (session, task) reported
        self.kernel_failed: set[int] = set()  # devices on which a kernel of this process failed

    def register(self, callback: Callable[[int], object]) -> None:
        """aclrtExceptionInfoCallbackRegister: registering one twice adds nothing."""
        with self._lock:
            if callback not in self._callbacks:
                self._callbacks.append(callback)

    def unregister(self, callback: Callable[[int], object]) -> None:
        """aclrtExceptionInfoCallbackUnregister: one not registered is no error."""
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def set_legacy(self, callback: Callable[[int], object] | None) -> None:
        """aclrtSetExceptionInfoCallback (deprecated): the one callback of that call (None
        removes it)."""
        with self._lock:
            self._legacy = callback

    def info(self, handle: int) -> ExceptionInfo | None:
        return self._infos.get(handle)

    def report(
        self, session: int, log: CallLog, streams: dict[int, StreamRecord], error: NpuError
    ) -> None:
        """A call of session `session` (whose call log is `log` and stream records `streams`)
        reports task `error.task_seq`'s failure: run the callbacks (once per failure) and
        wait for them."""
        seq = error.task_seq
        info = _describe(log, streams, seq, error.code)
        with self._lock:
            if info.function and info.device_id != U32:
                self.kernel_failed.add(info.device_id)
            callbacks = [*self._callbacks, *([self._legacy] if self._legacy else [])]
            key = (session, seq)
            if not callbacks or key in self._reported:
                return
            self._reported.append(key)
            handle = next(self._handles)
            self._infos[handle] = info
        runner = threading.Thread(
            target=_run, args=(callbacks, handle), name="simnpu-exception-callback", daemon=True
        )
        try:
            runner.start()
            runner.join()
        finally:
            with self._lock:
                del self._infos[handle]


def _run(callbacks: list[Callable[[int], object]], handle: int) -> None:
    for callback in callbacks:
        try:
            callback(handle)
        except Exception:  # noqa: BLE001 - a user's callback must not stop the others
            sys.stderr.write("simnpu: an exception-info callback raised:\n")
            traceback.print_exc()


def _describe(log: CallLog, streams: dict[int, StreamRecord], seq: int, code: int) -> ExceptionInfo:
    """The failed task `seq` as the client's call log knows it."""
    known = log.command(seq)
    stream, thread, record = known if known is not None else (0, 0, b"")
    found = streams.get(stream)
    context = found.context if found is not None else None
    function, args = 0, None
    for command in commands.decode(record) if record else ():
        if isinstance(command, commands.ThreadLimited):  # a launch bounded by a thread's limits
            command = command.launch
        if isinstance(command, (commands.Launch, commands.LaunchDeviceArgs)):
            function = command.function
        if isinstance(command, commands.LaunchDeviceArgs):
            args = (command.args_ptr, command.args_size)
    return ExceptionInfo(
        task_id=seq & U32,
        stream_id=(stream & U32) if stream else U32,
        thread_id=_native_id(thread),
        device_id=context.device if context is not None else U32,
        error_code=code & U32,
        function=function,
        args=args,
    )


def _native_id(ident: int) -> int:
    """The system thread id of the Python thread `ident` (as the C runtime reports a tid);
    U32 when that thread is gone or unknown."""
    for thread in threading.enumerate():
        if thread.ident == ident and thread.native_id is not None:
            return thread.native_id & U32
    return U32


EXCEPTIONS = ExceptionCallbacks()
