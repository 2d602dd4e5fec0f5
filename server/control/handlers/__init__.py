"""The session's handlers: `<concept>_calls.py` holds the handlers of the ACL calls on one
concept (what the calls do lives with the concept: server/graphs/, server/memory/,
server/hccl/, server/core/, and server/control/ for the session's own objects). A handler
decodes its request or command, looks the session's objects up, calls the feature and
encodes the reply; handlers do not import each other. Each module registers its functions
with `registry.handles` when it is imported here. See server/control/handlers/registry.py."""

from simnpu.server.control.handlers import (  # noqa: F401 - imported for their registrations
    builtin_task_calls,
    callback_calls,
    cnt_notify_calls,
    cond_task_calls,
    context_calls,
    copy_calls,
    device_calls,
    event_calls,
    graph_calls,
    hccl_calls,
    ipc_memory_calls,
    kernel_calls,
    memory_calls,
    model_build_calls,
    notify_calls,
    observation_calls,
    overflow_calls,
    pool_calls,
    session_calls,
    stream_calls,
    task_group_calls,
    value_calls,
    virtual_memory_calls,
)
from simnpu.server.control.handlers.registry import HANDLERS, LATER

__all__ = ["HANDLERS", "LATER"]
