"""What a session's handles stand for: `HandleKind`, the top bits of every handle the daemon
gives a client. Its own module so that handlers and the session's handle table
(server/control/session.py) both import it without importing each other."""

from __future__ import annotations

import enum


class HandleKind(enum.IntEnum):
    """What a handle stands for. A handle is `kind << 40 | n`, n counting up per session, so
    a handle of another kind, another session or a freed object is never mistaken for a
    live one (107017)."""

    CONTEXT = 1
    STREAM = 2
    EVENT = 3
    BINARY = 4
    FUNCTION = 5
    PINNED = 6
    MEM_POOL = 7
    PHYSICAL = 8  # a physical allocation (aclrtMallocPhysical, server/memory/virtual_memory.py)
    NOTIFY = 45
    CNT_NOTIFY = 170
    IPC_EVENT = 180  # another client's IPC event, opened in this one (server/core/ipc_events.py)
    MODEL_RI = 230  # a model run instance: a captured graph (server/graphs/capture.py)
    MODEL_STREAM = 231  # a stream of a model (aclmdlRIGetStreams)
    MODEL_TASK = 232  # a task of a model (aclmdlRIGetTasksByStream)
    REPLAY_STREAM = 233  # a replay's private stream: never in the table, never the client's
    LABEL = 246  # a label of built models' control flow (server/graphs/model_build.py)
    LABEL_LIST = 247  # a label list (aclrtCreateLabelList)
    TASK_GROUP = 243  # a task group of a model (aclmdlRICaptureTaskGrpEnd)
    COND_HANDLE = 248  # a condition of a captured model (server/graphs/cond_handles.py)
    COMMUNICATOR = 16
