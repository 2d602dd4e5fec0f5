"""rt.callbacks: host callbacks and host functions, host code that runs in stream order.

aclrtLaunchCallback queues a callback task; when the stream reaches it the daemon tells
this process, and the thread subscribed to that stream (aclrtSubscribeReport) runs it in
its aclrtProcessReport loop. A blocking callback holds its stream until it returns.
aclrtLaunchHostFunc needs no subscription: a thread owned by the runtime runs it, and the
stream always waits for it; once a thread subscribed to the stream with
aclrtSubscribeHostFunc, that thread runs them instead, in its aclrtProcessHostFunc loop.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.client.transport import call_site
from simnpu.proto import codes, commands
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.shared import Shared


class HostCallbacks:
    """Host callbacks and host functions of one session (see the module docstring)."""

    def __init__(self, shared: Shared):
        self.connection = shared.connection
        self._contexts = shared.contexts
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, tuple] = {}  # id -> (function, data, stream, blocking, queue)
        self._kept: dict[int, tuple] = {}  # the same, of callbacks recorded in live models
        self._subscriptions: dict[int, int] = {}  # stream -> thread id
        self._reports: dict[int, queue.SimpleQueue] = {}  # thread id -> callbacks for it to run
        self._host_functions: queue.SimpleQueue | None = None
        self._host_subscriptions: dict[int, int] = {}  # stream -> thread id (host functions)
        self._host_reports: dict[int, queue.SimpleQueue] = {}  # thread id -> host functions

    # ---- subscriptions: aclrtSubscribeReport, aclrtSubscribeHostFunc and their ends --------
    @records_errors
    def subscribe_report(self, thread_id: int, stream: int) -> None:
        """aclrtSubscribeReport: thread `thread_id` runs the stream's callbacks
        (process_report)."""
        taken = "is already subscribed"
        self._subscribe(self._subscriptions, self._reports, thread_id, stream, taken)

    @records_errors
    def unsubscribe_report(self, thread_id: int, stream: int) -> None:
        """aclrtUnSubscribeReport."""
        self._unsubscribe(self._subscriptions, thread_id, stream, "thread")

    @records_errors
    def subscribe_host_func(self, thread_id: int, stream: int) -> None:
        """aclrtSubscribeHostFunc: thread `thread_id` runs the stream's host functions."""
        taken = "already has a host function thread"
        self._subscribe(self._host_subscriptions, self._host_reports, thread_id, stream, taken)

    @records_errors
    def unsubscribe_host_func(self, thread_id: int, stream: int) -> None:
        """aclrtUnSubscribeHostFunc: the runtime's own thread runs them again."""
        self._unsubscribe(self._host_subscriptions, thread_id, stream, "host function thread")

    def _subscribe(
        self,
        subscriptions: dict[int, int],
        reports: dict[int, queue.SimpleQueue],
        thread_id: int,
        stream: int,
        taken: str,
    ) -> None:
        """Thread `thread_id` runs what `subscriptions` hands it from `stream` (100033 if
        another already does: the stream `taken`)."""
        stream = self._contexts.stream(stream)
        with self._lock:
            if stream in subscriptions:
                raise NpuError(codes.ACL_ERROR_REPEAT_SUBSCRIBE, f"stream {stream:#x} {taken}")
            subscriptions[stream] = thread_id
            reports.setdefault(thread_id, queue.SimpleQueue())

    def _unsubscribe(
        self, subscriptions: dict[int, int], thread_id: int, stream: int, runner: str
    ) -> None:
        stream = self._contexts.stream(stream)
        with self._lock:
            if subscriptions.get(stream) != thread_id:
                raise NpuError(
                    codes.ACL_ERROR_STREAM_NOT_SUBSCRIBE,
                    f"stream {stream:#x} is not subscribed to {runner} {thread_id}",
                )
            del subscriptions[stream]

    # ---- queueing ---------------------------------------------------------------------------
    @records_errors
    def launch_callback(
        self, function, data, block_type: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtLaunchCallback (async): ACL_CALLBACK_BLOCK holds the stream until it returns."""
        if block_type not in (codes.ACL_CALLBACK_NO_BLOCK, codes.ACL_CALLBACK_BLOCK):
            raise invalid(f"unknown callback block type {block_type}")
        blocking = block_type == codes.ACL_CALLBACK_BLOCK
        stream = self._contexts.stream(stream)
        with self._lock:
            thread_id = self._subscriptions.get(stream)
            if thread_id is None:
                raise NpuError(
                    codes.ACL_ERROR_RT_STREAM_NO_CB_REG,
                    "launch_callback on a stream no thread subscribed to (subscribe_report first)",
                )
            target = self._reports[thread_id]
        self._queue(function, data, blocking, stream, target, site)

    @records_errors
    def launch_host_func(self, stream: int, function, data, site: str | None = None) -> None:
        """aclrtLaunchHostFunc (async): the stream waits until `function(data)` has returned,
        run in stream order by the stream's subscribed host function thread, else by the
        runtime's own."""
        stream = self._contexts.stream(stream)
        with self._lock:
            thread_id = self._host_subscriptions.get(stream)
            if thread_id is not None:
                target = self._host_reports[thread_id]
        if thread_id is not None:
            self._queue(function, data, True, stream, target, site)
            return
        self.launch_runtime_func(function, data, stream, site)

    def launch_runtime_func(self, function, data, stream: int, site: str | None = None) -> None:
        """A task of the runtime's own (a managed-memory prefetch): the stream waits until
        `function(data)` has returned, always run by the runtime's thread."""
        with self._lock:
            if self._host_functions is None:
                self._host_functions = queue.SimpleQueue()
                threading.Thread(
                    target=self._run_host_functions, name="simnpu-host-func", daemon=True
                ).start()
        self._queue(function, data, True, stream, self._host_functions, site)

    def _queue(self, function, data, blocking, stream, target, site: str | None) -> None:
        callback = next(self._ids)
        with self._lock:
            self._pending[callback] = (function, data, stream, blocking, target)
        self.connection.expect_notice()
        self.connection.send_command(
            commands.HostCallback.pack(stream, callback, blocking), site or call_site(), stream
        )

    # ---- running -----------------------------------------------------------------------------
    def arrived(self, callback: int) -> None:
        """The daemon reached callback `callback` (receiver thread): hand it to its runner."""
        with self._lock:
            entry = self._pending.pop(callback, None) or self._kept.get(callback)
        if entry is not None:
            entry[4].put((callback, entry))

    def keep(self, callbacks: Iterable[int]) -> None:
        """These callbacks were recorded in a model (aclmdlRICaptureEnd): they did not run,
        and each replay announces them again, until `forget`."""
        with self._lock:
            for callback in callbacks:
                entry = self._pending.pop(callback, None)
                if entry is not None:
                    self._kept[callback] = entry

    def forget(self, callbacks: Iterable[int]) -> None:
        """Their model was destroyed."""
        with self._lock:
            for callback in callbacks:
                self._kept.pop(callback, None)

    @records_errors
    def process_report(self, timeout_ms: int = -1) -> None:
        """aclrtProcessReport: run the next callback for this thread's streams. Blocks up to
        `timeout_ms` (-1: forever); 507012 when none arrives in time."""
        self._process(self._reports, timeout_ms, "callback")

    @records_errors
    def process_host_func(self, timeout_ms: int = -1) -> None:
        """aclrtProcessHostFunc: run the next host function of the streams this thread
        subscribed to. Blocks up to `timeout_ms` (-1: forever); 507012 when none arrives."""
        self._process(self._host_reports, timeout_ms, "host function")

    def _process(self, runners: dict[int, queue.SimpleQueue], timeout_ms: int, what: str) -> None:
        if timeout_ms < -1:
            raise NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"timeout {timeout_ms} ms")
        reports = runners.get(threading.get_ident())
        if reports is None:
            raise NpuError(
                codes.ACL_ERROR_RT_THREAD_SUBSCRIBE,
                f"no stream is subscribed to this thread ({what}s)",
            )
        try:
            callback, entry = reports.get(timeout=None if timeout_ms == -1 else timeout_ms / 1000)
        except queue.Empty:
            raise NpuError(
                codes.ACL_ERROR_RT_REPORT_TIMEOUT, f"no {what} within {timeout_ms} ms"
            ) from None
        self._run(callback, entry)

    def _run_host_functions(self) -> None:
        host_functions = self._host_functions
        assert host_functions is not None  # the thread starts once the queue is made
        while True:
            callback, entry = host_functions.get()
            self._run(callback, entry)

    def _run(self, callback: int, entry: tuple) -> None:
        function, data, stream, blocking, _ = entry
        try:
            function(data)
        except Exception:  # the stream must not hang on a failing callback
            print(f"simnpu: host callback {function!r} raised:", file=sys.stderr)
            traceback.print_exc()
        finally:
            if blocking and self.connection.broken is None:
                self.connection.send_command(
                    commands.HostDone.pack(stream, callback, False), "host callback"
                )
