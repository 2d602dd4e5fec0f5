"""The raw layer's conditional task calls of captured models (aclmdlRICondHandleCreate,
aclmdlRICondHandleGetCondPtr, aclmdlRIAddCondTask): a mixin of Runtime (client/runtime.py).
The conditions, the cond tasks and their sub models are the daemon's (server/cond_tasks.py;
docs/graph-capture.md, "Conditional tasks").

What the host keeps: each condition's model and device address, and each sub model's
parent (the model its cond task belongs to), so that sub models are refused where the
runtime refuses them and go with their model.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_graphs import Model
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, bad_handle, invalid
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.callbacks import HostCallbacks
    from simnpu.client.capture_modes import CaptureModes
    from simnpu.client.transport import Connection

_TYPES = (
    codes.ACL_MODEL_RI_COND_TYPE_IF,
    codes.ACL_MODEL_RI_COND_TYPE_WHILE,
    codes.ACL_MODEL_RI_COND_TYPE_SWITCH,
)
_UINT32 = 1 << 32


def _null(name: str) -> NpuError:
    """ACL's own null check (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{name} is null")


class RuntimeCondTasks:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    connection: Connection
    callbacks: HostCallbacks
    models: dict[int, Model]
    capturing: dict[int, tuple[int, bool]]  # origin stream -> (its model, made by the capture)
    capture_modes: CaptureModes
    unready: dict[int, str]
    allocations: dict[int, tuple[int, int]]  # address -> (size, device)
    _lock: threading.Lock
    conditions: dict[int, tuple[int, int]]  # condition handle -> (its model, its address)
    sub_models: dict[int, int]  # sub model of a cond task -> the model of that task

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def stream(self, handle: int) -> int: ...
        def add_model(self, handle: int) -> None: ...
        def _remember(self, address: int, size: int, device: int) -> None: ...
        def _forget(self, address: int) -> None: ...

    @records_errors
    def cond_handle_create(self, model: int, default_value: int, flag: int) -> int:
        """aclmdlRICondHandleCreate: a condition (a uint64 in device memory, 0 at first) of a
        model being captured. 107000 for another flag than 0 or ASSIGN_DEFAULT or a model not
        in the capture stage, 207000 for a built model."""
        if not model:
            raise _null("modelRI")
        if not 0 <= default_value < _UINT32:
            raise invalid(f"defaultLaunchValue {default_value} is not a uint32")
        if not 0 <= flag < _UINT32:
            raise invalid(f"flag {flag}: use 0 or ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT")
        reply = self._call(
            pb.CondHandleCreateRequest(model=model, default_value=default_value, flag=flag)
        )
        self.conditions[reply.handle] = (model, reply.pointer)
        # usable by copies and kernels as any block of this process, until the model goes
        self._remember(reply.pointer, 8, split_device_address(reply.pointer)[0])
        return reply.handle

    @records_errors
    def cond_handle_get_cond_ptr(self, handle: int) -> int:
        """aclmdlRICondHandleGetCondPtr: the device address of the condition's uint64. Host
        only."""
        if not handle:
            raise _null("handle")
        found = self.conditions.get(handle)
        if found is None:
            raise bad_handle("condition", handle)
        return found[1]

    @records_errors
    def add_cond_task(self, params: Any, stream: int, flags: int) -> list[int]:
        """aclmdlRIAddCondTask: a cond task recorded on the capturing stream; its new sub
        models, in branch order. 107000 for a type out of range, flags not 0, a null handle,
        a handle used already, a size the type does not take or a stream captured into
        another model; 107029 for a stream not in capture. Blocks."""
        if not stream:
            raise _null("stream")
        if not isinstance(params, dict):
            raise _null("params")
        kind, size, handle = params.get("type"), params.get("size"), params.get("handle")
        if not isinstance(kind, int) or kind not in _TYPES:
            raise invalid(f"params.type {kind!r}: use an aclmdlRICondTaskType")
        if flags:
            raise invalid(f"flags {flags}: reserved, must be 0")
        if not handle:
            raise invalid("params.handle is null")
        if not isinstance(handle, int):
            raise invalid(f"params.handle {handle!r} is not a condition handle")
        if not isinstance(size, int) or not 0 <= size < _UINT32:
            raise invalid(f"params.size {size!r} is not a uint32")
        reply = self._call(
            pb.AddCondTaskRequest(stream=self.stream(stream), handle=handle, type=kind, size=size)
        )
        model = self.conditions[handle][0] if handle in self.conditions else 0
        for sub in reply.sub_models:
            self.add_model(sub)
            self.sub_models[sub] = model
        return list(reply.sub_models)

    def _not_sub_model(self, model: int) -> None:
        """207000 for a sub model of a cond task, where the runtime refuses one (it runs, and
        goes, only with the model of its cond task)."""
        if model in self.sub_models:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "a sub model of a cond task does not support this call (use its model's)",
            )

    def _forget_sub_models(self, model: int) -> None:
        """`model` is gone: its conditions and the sub models of its cond tasks go too."""
        for handle in [h for h, (owner, _) in self.conditions.items() if owner == model]:
            _, address = self.conditions.pop(handle)
            with self._lock:
                if address in self.allocations:  # (unless the program freed it)
                    self._forget(address)
        for sub in [s for s, parent in self.sub_models.items() if parent == model]:
            del self.sub_models[sub]
            for stream in [s for s, (captured, _) in self.capturing.items() if captured == sub]:
                del self.capturing[stream]  # its capture ended with it
                self.capture_modes.ended(stream)
            kept = self.models.pop(sub, None)
            self.unready.pop(sub, None)
            if kept is not None:
                self.connection.forget_sites(kept.seqs)
                self.callbacks.forget(kept.callbacks)
            self._forget_sub_models(sub)
