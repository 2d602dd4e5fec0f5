"""The one way a session's calls find their handlers: `@handles(Kind)` on a function.

A request's handler is keyed by the type of its body (npu.proto's XxxRequest) and called
as `handler(session, body, request_id)`; it returns the reply body (None when the reply
carries none) or LATER when it will answer itself (session.respond), from a waiter or the
scheduler. A command's handler is keyed by its record type (simnpu.proto.commands) and
called as `handler(session, record)`; it queues the call's task, or raises NpuError to
reject the call (reported at the next synchronize).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

HANDLERS: dict[type, Callable[..., Any]] = {}
LATER = object()  # a request handler's result when the reply is sent later


def handles(*kinds: type) -> Callable:
    """Register the decorated function as the handler of `kinds`."""

    def register(function: Callable) -> Callable:
        for kind in kinds:
            assert kind not in HANDLERS, f"two handlers for {kind.__name__}"
            HANDLERS[kind] = function
        return function

    return register
