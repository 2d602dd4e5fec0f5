"""The Runtime: this process's session with the daemon and the parts of the raw layer.

A Runtime opens the session (client/transport.py's Connection), maps the fast path when this
process shares the daemon's /dev/shm (client/fast_path.py), and makes the parts, each
constructed with what it needs and holding its own state:

    contexts      devices set, contexts, the current context of each thread, and the
                  records of streams and events (client/runtime/contexts.py)
    streams       stream calls                                   (streams.py)
    events        event calls                                    (events.py)
    sync          synchronize and query, on the streams' signals (synchronization.py)
    memory        device memory: malloc/free, copies, pools, IPC (memory.py)
    vmm           reserved ranges, physical memory, mappings     (virtual_memory.py)
    host          pinned and registered host memory              (pinned_memory.py)
    managed       managed memory and its advice                  (managed_memory.py)
    kernels       binaries, functions, launches, built-in tasks  (kernels.py)
    graphs        model run instances: capture, replay, cond tasks (graphs.py)
    model_build   built models, stream control, labels           (model_build.py)
    task_groups   task groups and task changes                   (task_groups.py)
    notifies      notifies, count notifies, values               (notifies.py)
    devices       device queries, limits, peers, overflow, errors (devices.py)
    callbacks     host callbacks and host functions              (callbacks.py)

They share (client/runtime/shared.py) the calls to the daemon, the contexts with the
stream and event records, the allocation index (`allocations`: the device ranges this
process may use), the pinned blocks (client/hostmem.py) and the capture modes; a part that
needs another is handed it at construction, and none reads another's private state.
Failures raise NpuError (and are kept as the thread's last error). The Pythonic API and the
`acl` facade both stand on the parts.

The flat names of the Runtime that was one object (`runtime().malloc(...)`) still work for
programs that used them: `__getattr__` finds the one part that has the name, and warns once
per name with FlatNameWarning.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from simnpu.client import fast_path
from simnpu.client.capture_modes import CaptureModes
from simnpu.client.copies import CopyPaths
from simnpu.client.hostmem import PinnedBlocks
from simnpu.client.observe import ClientObserver
from simnpu.client.runtime.allocation_index import AllocationIndex
from simnpu.client.runtime.callbacks import HostCallbacks
from simnpu.client.runtime.calls import Calls
from simnpu.client.runtime.contexts import Contexts, StreamRecord
from simnpu.client.runtime.devices import Devices
from simnpu.client.runtime.events import Events
from simnpu.client.runtime.graphs import Graphs
from simnpu.client.runtime.kernels import Kernels
from simnpu.client.runtime.managed_memory import ManagedMemory
from simnpu.client.runtime.memory import DeviceMemory, env_memory_limit
from simnpu.client.runtime.model_build import ModelBuild
from simnpu.client.runtime.notifies import Notifies
from simnpu.client.runtime.pinned_memory import PinnedMemory
from simnpu.client.runtime.shared import Shared
from simnpu.client.runtime.streams import Streams, ThreadLimits
from simnpu.client.runtime.synchronization import Synchronization
from simnpu.client.runtime.task_groups import TaskGroups
from simnpu.client.runtime.virtual_memory import VirtualMemory
from simnpu.client.transport import Connection
from simnpu.proto import npu_pb2 as pb
from simnpu.shm import heap
from simnpu.shm.region import Region


class FlatNameWarning(DeprecationWarning):
    """A program used a flat name of the Runtime (`runtime().malloc`), which is a part's
    method now (`runtime().memory.malloc`)."""


PARTS: dict[str, type] = {
    "contexts": Contexts,
    "streams": Streams,
    "events": Events,
    "sync": Synchronization,
    "memory": DeviceMemory,
    "vmm": VirtualMemory,
    "host": PinnedMemory,
    "managed": ManagedMemory,
    "kernels": Kernels,
    "graphs": Graphs,
    "model_build": ModelBuild,
    "task_groups": TaskGroups,
    "notifies": Notifies,
    "devices": Devices,
    "callbacks": HostCallbacks,
}
"""The Runtime's parts: attribute -> class."""


def _flat_names() -> dict[str, str]:
    """Each public name of a part -> the part that has it. Names are unique across parts
    (tests/client/test_runtime_parts.py); were one not, the first part listed would win."""
    names: dict[str, str] = {}
    for part, cls in PARTS.items():
        for name in dir(cls):
            if not name.startswith("_"):
                names.setdefault(name, part)
    return names


FLAT_NAMES = _flat_names()
_warned: set[str] = set()  # flat names warned about in this process


class Runtime:
    """This process's view of the simulated NPU (see the module docstring). Thread-safe;
    one per process is usual."""

    contexts: Contexts
    streams: Streams
    events: Events
    sync: Synchronization
    memory: DeviceMemory
    vmm: VirtualMemory
    host: PinnedMemory
    managed: ManagedMemory
    kernels: Kernels
    graphs: Graphs
    model_build: ModelBuild
    task_groups: TaskGroups
    notifies: Notifies
    devices: Devices
    callbacks: HostCallbacks

    def __init__(self, address: str | None = None, token: str | None = None):
        self.connection = connection = Connection(
            address, token, on_callback=self._callback_arrived
        )
        hello = connection.call(
            pb.HelloRequest(
                pid=os.getpid(),
                memory_limit=env_memory_limit(),
                process_name=os.path.basename(sys.argv[0] or "python") or "python",
            )
        )
        self.session_id, self.device_count = hello.session, hello.devices
        self.ai_cores, self.copy_engines = hello.ai_cores, hello.copy_engines
        self._blocks = blocks = PinnedBlocks()  # pinned blocks
        staging = _attach_staging(hello.staging_segment, hello.staging_bytes, hello.probe)
        if staging is None:  # copies travel in-stream: their chunks reuse warm heap memory
            heap.keep_freed_memory()
        # the fast path (docs/fast-path.md): calls through the submission ring, replies and
        # streams' completion signals through the notify area, when the staging probe showed
        # that this process shares the daemon's /dev/shm
        self.fast_path = (
            fast_path.attach(connection, hello.notify_segment, hello.ring_segment)
            if staging is not None
            else None
        )
        area = self.fast_path.area if self.fast_path is not None else None
        # tracing and checking: SIMNPU_TRACE / SIMNPU_CHECK, or the daemon's --trace / --check
        self.observer = ClientObserver(connection, hello.observe_flags)

        self.allocations = allocations = AllocationIndex()
        streams: dict[int, StreamRecord] = {}  # the stream records (kept by the contexts)
        calls = Calls(connection, self.session_id, streams)
        signals = area is not None
        self.contexts = Contexts(calls, streams, self.device_count, connection.log, signals)
        shared = Shared(calls, connection, self.contexts, allocations, blocks, CaptureModes())
        limits = ThreadLimits()
        self.callbacks = HostCallbacks(shared)
        self.sync = Synchronization(shared, self.observer, area)
        self.streams = Streams(shared, limits)
        self.events = Events(shared, signals)
        self.devices = Devices(shared, self.streams)
        self._copies = CopyPaths(shared, staging, hello.staging_bytes, self.devices)
        self.host = PinnedMemory(shared, self.sync, staging is not None)
        self.managed = ManagedMemory(shared, self.host, self.callbacks)
        self.memory = DeviceMemory(shared, self._copies, self.host, self.managed, self.sync)
        self.vmm = VirtualMemory(shared)
        self.kernels = Kernels(shared, limits)
        self.graphs = Graphs(shared, self.callbacks, self.sync)
        self.model_build = ModelBuild(shared, self.graphs)
        self.task_groups = TaskGroups(shared, self.graphs)
        self.notifies = Notifies(shared)

    def _callback_arrived(self, callback: int) -> None:
        """The daemon reached host callback `callback` (the receiver thread)."""
        self.callbacks.arrived(callback)

    def __getattr__(self, name: str) -> Any:
        """A flat name of the old Runtime (`malloc`): the method of the part that has it,
        with a FlatNameWarning the first time the name is used in this process."""
        part = FLAT_NAMES.get(name)
        target = None if part is None else self.__dict__.get(part)
        if target is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"Runtime.{name} is Runtime.{part}.{name} now", FlatNameWarning, stacklevel=2
            )
        return getattr(target, name)

    def close(self) -> None:
        """End the session; the daemon frees whatever this process still owns. Blocks."""
        self.observer.finish()  # trace and report files, while the session is still there
        for block in self._blocks.blocks():
            if block.region is not None:
                try:
                    block.region.close()
                except BufferError:
                    pass
        self._copies.close()
        self.connection.close()
        fast, self.fast_path = self.fast_path, None
        if fast is not None:
            fast.close()


def _attach_staging(name: str, size: int, probe: bytes) -> Region | None:
    """Map the session's staging area if this process shares the daemon's /dev/shm
    (checked with the probe bytes, not just the name); None means in-stream copies."""
    if os.environ.get("SIMNPU_NO_SHM") == "1":
        return None
    try:
        region = Region.attach(name)
    except Exception:
        return None
    if region.size < size + len(probe) or bytes(region.map[size : size + len(probe)]) != probe:
        region.close()
        return None
    return region
