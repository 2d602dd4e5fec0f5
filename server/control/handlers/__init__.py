"""The session's handlers, one module per ACL concept; each registers its functions with
`registry.handles` when it is imported here. See server/control/handlers/registry.py."""

from simnpu.server.control.handlers import (  # noqa: F401 - imported for their registrations
    builtin_tasks,
    callbacks,
    cnt_notifies,
    collectives,
    cond_tasks,
    contexts,
    copies,
    devices,
    event_timestamps,
    events,
    graphs,
    host_register,
    ipc,
    ipc_events,
    jobs,
    kernels,
    labels,
    launch_config,
    memory,
    memset_d32,
    model_build,
    notifies,
    observation,
    overflow,
    pools,
    session,
    stream_abort,
    stream_limits,
    streams,
    task_groups,
    values,
    virtual_memory,
)
from simnpu.server.control.handlers.registry import HANDLERS, LATER

__all__ = ["HANDLERS", "LATER"]
