"""The session itself: HELLO (the staging area and the fast path's segments), the switch to
the submission ring, the client's operator execution timeout."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import invalid
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.untrusted import PROCESS_NAME, cut
from simnpu.server.observation import observer
from simnpu.shm.region import Region, segment_name

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

PROBE_BYTES = 16  # after the staging area's usable bytes: proof that the client maps it


@handles(pb.HelloRequest)
def hello(session: Session, request: pb.HelloRequest, reply_to: int) -> pb.HelloReply:
    owner = session.owner
    # the pid the credentials socket verified (server/control/credentials.py), else the one the
    # client claims: what smi and messages show; IPC whitelists take only a verified one
    owner.pid = session.daemon.peer_of(session).pid or request.pid
    owner.process_name = cut(request.process_name, PROCESS_NAME) or "?"  # for display: cut
    if request.memory_limit:  # the client's SIMNPU_MEMORY_LIMIT (server/memory/quotas.py)
        session.memory.limits.set(None, request.memory_limit)
    config = session.daemon.config
    if session.staging is None:
        session.staging = Region.create(
            segment_name(f"s{session.id}", "staging"), config.staging_bytes + PROBE_BYTES
        )
    probe = os.urandom(PROBE_BYTES)
    session.staging.map[config.staging_bytes : config.staging_bytes + PROBE_BYTES] = probe
    notify, ring = session.fast_path.create()
    return pb.HelloReply(
        session=session.id,
        devices=len(session.daemon.devices),
        staging_bytes=config.staging_bytes,
        ai_cores=config.ai_cores,
        copy_engines=config.copy_engines,
        observe_flags=observer.hello_flags(session.daemon.observer, session.owner),
        staging_segment=session.staging.name,
        notify_segment=notify,
        ring_segment=ring,
        probe=probe,
    )


@handles(pb.UseRingRequest)
def use_ring(session: Session, request: pb.UseRingRequest, reply_to: int) -> None:
    """From now on the client's calls come through its submission ring (this reply goes out
    the usual way)."""
    session.fast_path.use_ring()


@handles(pb.SetOpExecuteTimeoutRequest)
def set_op_execute_timeout(
    session: Session, request: pb.SetOpExecuteTimeoutRequest, reply_to: int
) -> None:
    """aclrtSetOpExecuteTimeOut(WithMs): 0 restores the daemon's default."""
    if request.milliseconds < 0:
        raise invalid("the operator execution timeout cannot be negative")
    session.owner.op_timeout_s = request.milliseconds / 1000.0 if request.milliseconds else None
