"""The task kinds, one module each (as the CANN runtime gives each task kind its own):
what happens when a task is submitted, reaches the head of its stream, is handed to units,
completes or is dropped lives with its kind (server/core/tasks/base.py). The kinds of
features (a collective, a replay, graphs' control flow) live in their feature's folder."""

from simnpu.server.core.tasks.base import DeviceWork, Task, TaskState
from simnpu.server.core.tasks.cnt_notify import CntNotifyRecordTask, CntNotifyWaitTask
from simnpu.server.core.tasks.configured_kernel import ConfiguredKernelTask
from simnpu.server.core.tasks.copy import CopyTask
from simnpu.server.core.tasks.event import RecordTask, ResetTask, WaitTask
from simnpu.server.core.tasks.host_callback import HostCallbackTask
from simnpu.server.core.tasks.kernel import KernelTask
from simnpu.server.core.tasks.memset import MemsetTask
from simnpu.server.core.tasks.memset_d32 import MemsetD32Task
from simnpu.server.core.tasks.notify import NotifyRecordTask, NotifyWaitTask
from simnpu.server.core.tasks.overflow import OverflowResetTask, OverflowStatusTask
from simnpu.server.core.tasks.random_num import RandomNumTask
from simnpu.server.core.tasks.reduce_copy import ReduceCopyTask
from simnpu.server.core.tasks.value import ValueWaitTask, ValueWriteTask

__all__ = [
    "CntNotifyRecordTask",
    "CntNotifyWaitTask",
    "ConfiguredKernelTask",
    "CopyTask",
    "DeviceWork",
    "HostCallbackTask",
    "KernelTask",
    "MemsetD32Task",
    "MemsetTask",
    "NotifyRecordTask",
    "NotifyWaitTask",
    "OverflowResetTask",
    "OverflowStatusTask",
    "RandomNumTask",
    "RecordTask",
    "ReduceCopyTask",
    "ResetTask",
    "Task",
    "TaskState",
    "ValueWaitTask",
    "ValueWriteTask",
    "WaitTask",
]
