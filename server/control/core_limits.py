"""The AI-core limits a client sets for itself: a process's on a device
(aclrtSetDeviceResLimit / Reset / Get) and a stream's (aclrtSetStreamResLimit / Reset / Get),
with the checks both share.

A simulated AI core runs cube and vector work alike, so the cube-core and the vector-core
limits in force both bound the AI cores a kernel runs on: the scheduler hands its work only
to the first `min(cube, vector)` cores of the device (server/core/scheduler.py). A stream's
limit of a type is its own when set, else its process's on the device, else every AI core:
the stream's limit wins over the process's, even when larger (`Stream.limits`,
`Stream.core_limit`, which the scheduler reads; a process's is `Owner.core_limits`). A launch
of a thread that uses a stream's limits (aclrtUseStreamResInCurrentThread) is bounded by that
stream's core limit, whatever stream it runs on (`Task.limits_from`, which the launch's
handler sets: server/control/handlers/kernel_calls.py).

These are the client's own choices; what the daemon allows a client is
server/control/client_limits.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.executor import UnitKind

if TYPE_CHECKING:
    from simnpu.server.core.device import Device
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream

LIMIT_TYPES = (codes.ACL_RT_DEV_RES_CUBE_CORE, codes.ACL_RT_DEV_RES_VECTOR_CORE)


def ai_cores(device: Device) -> int:
    """How many AI cores `device` has: the largest limit."""
    return len(device.units[UnitKind.AI_CORE])


def check_limit(kind: int, value: int, device: int, cores: int) -> None:
    """107000 unless `kind` is the cube or the vector cores and `value` 1 .. `cores`."""
    if kind not in LIMIT_TYPES:
        raise NpuError(
            codes.ACL_ERROR_RT_PARAM_INVALID,
            f"resource type {kind}: use ACL_RT_DEV_RES_CUBE_CORE (0) or "
            "ACL_RT_DEV_RES_VECTOR_CORE (1)",
        )
    if not 1 <= value <= cores:
        raise NpuError(
            codes.ACL_ERROR_RT_PARAM_INVALID,
            f"limit {value}: device {device} has {cores} AI cores (a limit is 1 .. {cores})",
        )


def _process_limits(owner: Owner, device: int, cores: int) -> tuple[int, int]:
    limits = owner.res_limits.get(device, {})
    return tuple(limits.get(kind, cores) for kind in LIMIT_TYPES)  # type: ignore[return-value]


def process_limits(scheduler: Scheduler, owner: Owner, device: int, cores: int) -> tuple[int, int]:
    """(cube, vector) limits of `owner` on `device`; every core when none is set."""
    with scheduler.lock:
        return _process_limits(owner, device, cores)


def set_process_limit(
    scheduler: Scheduler, owner: Owner, device: int, cores: int, kind: int | None, value: int
) -> tuple[int, int]:
    """aclrtSetDeviceResLimit (`kind`), or with `kind` None aclrtResetDeviceResLimit: from
    now on the process's kernels on the device run on at most that many AI cores. Its
    (cube, vector) limits afterwards."""
    if kind is not None:
        check_limit(kind, value, device, cores)
    with scheduler.lock:
        if kind is None:
            owner.res_limits.pop(device, None)
        else:
            owner.res_limits.setdefault(device, {})[kind] = value
        cube, vector = _process_limits(owner, device, cores)
        if min(cube, vector) < cores:
            owner.core_limits[device] = min(cube, vector)
        else:
            owner.core_limits.pop(device, None)
    return cube, vector


def set_stream_limit(
    scheduler: Scheduler, stream: Stream, cores: int, kind: int | None, value: int, reset: bool
) -> tuple[int, int]:
    """aclrtSetStreamResLimit (`kind` set), aclrtResetStreamResLimit (`reset`) or
    aclrtGetStreamResLimit (neither): the stream's (cube, vector) limits in force
    afterwards."""
    if kind is not None:
        check_limit(kind, value, stream.device, cores)
    with scheduler.lock:
        if reset:
            stream.res_limits.clear()
        elif kind is not None:
            stream.res_limits[kind] = value
        return stream.limits(cores)
