"""The task kinds, one module each (as the CANN runtime gives each task kind its own):
what happens when a task is submitted, reaches the head of its stream, is handed to units,
completes or is dropped lives with its kind (server/tasks/base.py)."""

from simnpu.server.tasks.base import DeviceWork, Task, TaskState
from simnpu.server.tasks.cnt_notify import CntNotifyRecordTask, CntNotifyWaitTask
from simnpu.server.tasks.collective import CollectiveTask
from simnpu.server.tasks.configured_kernel import ConfiguredKernelTask
from simnpu.server.tasks.copy import CopyTask
from simnpu.server.tasks.event import RecordTask, ResetTask, WaitTask
from simnpu.server.tasks.host_callback import HostCallbackTask
from simnpu.server.tasks.kernel import KernelTask
from simnpu.server.tasks.memset import MemsetTask
from simnpu.server.tasks.memset_d32 import MemsetD32Task
from simnpu.server.tasks.notify import NotifyRecordTask, NotifyWaitTask
from simnpu.server.tasks.overflow import OverflowResetTask, OverflowStatusTask
from simnpu.server.tasks.random_num import RandomNumTask
from simnpu.server.tasks.reduce_copy import ReduceCopyTask
from simnpu.server.tasks.replay import ReplayTask
from simnpu.server.tasks.value import ValueWaitTask, ValueWriteTask

__all__ = [
    "CntNotifyRecordTask",
    "CntNotifyWaitTask",
    "CollectiveTask",
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
    "ReplayTask",
    "ResetTask",
    "Task",
    "TaskState",
    "ValueWaitTask",
    "ValueWriteTask",
    "WaitTask",
]
