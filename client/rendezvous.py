"""Job rendezvous (a simnpu extension): rank and root info for identical processes.

HCCL expects every process to know its rank and to receive rank 0's root info somehow.
Replicas started alike (`docker compose up --scale rank=4`, a job array) know neither;
they ask the daemon instead:

    import simnpu.client as npu
    from simnpu.client.collectives import Communicator
    from simnpu.client.rendezvous import rendezvous

    me = rendezvous("train", 4)          # blocks until 4 processes of job "train" asked
    npu.Device(me.rank % npu.device_count())
    with Communicator(me.world_size, me.root_info, me.rank) as comm:
        ...

Ranks are handed out in arrival order once the whole world is there, so a process that
dies while waiting is simply replaced by the next one to arrive. The wait is bounded by
this process's HCCL_CONNECT_TIMEOUT (default 120 s), the root info carries rank 0's
HCCL_EXEC_TIMEOUT. `hccl.rendezvous` is the pyACL-style twin. from_env() reads the job
from SIMNPU_JOB and SIMNPU_WORLD_SIZE, for programs that also run without one.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from simnpu.client import hcclrt
from simnpu.client.device import runtime
from simnpu.client.hcclrt import HcclError, seconds_from_env
from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb

JOB_ENV = "SIMNPU_JOB"
WORLD_SIZE_ENV = "SIMNPU_WORLD_SIZE"
SEED_ENV = "SIMNPU_JOB_SEED"  # host:port of the daemon whose rendezvous spans hosts


class Rank(NamedTuple):
    """What the rendezvous gave this process."""

    rank: int
    world_size: int
    root_info: bytes  # HCCL_ROOT_INFO_BYTES, the same for every rank of the job
    job: str
    formation: int  # 1 for the job's first communicator, 2 for the next, ...


def rendezvous(job: str, world_size: int) -> Rank:
    """Wait until `world_size` processes of `job` have asked; this one's rank and the job's
    root info. Blocks. HcclError: HCCL_E_PARA (bad name or size, or the waiting processes
    asked for another world size), HCCL_E_TIMEOUT (HCCL_CONNECT_TIMEOUT passed)."""
    if not isinstance(job, str) or not job:
        raise HcclError(ht.HCCL_E_PARA, f"the job name must be a non-empty str, not {job!r}")
    world_size = int(world_size)
    if world_size < 1:
        raise HcclError(ht.HCCL_E_PARA, f"world size {world_size} is not at least 1")
    exec_timeout_s = seconds_from_env(ht.EXEC_TIMEOUT_ENV, ht.DEFAULT_EXEC_TIMEOUT_S)
    timeout_s = seconds_from_env(ht.CONNECT_TIMEOUT_ENV, ht.DEFAULT_CONNECT_TIMEOUT_S)
    reply = hcclrt.of(runtime()).call(
        pb.HcclRendezvousRequest(
            job=job,
            world_size=world_size,
            exec_timeout_ms=round(exec_timeout_s * 1000),
            timeout_ms=round(timeout_s * 1000),
            seed=os.environ.get(SEED_ENV, ""),
        )
    )
    return Rank(reply.rank, reply.world_size, bytes(reply.root_info), reply.job, reply.formation)


def from_env() -> Rank | None:
    """rendezvous(SIMNPU_JOB, SIMNPU_WORLD_SIZE) when SIMNPU_JOB is set, else None."""
    job = os.environ.get(JOB_ENV)
    if not job:
        return None
    size = os.environ.get(WORLD_SIZE_ENV, "")
    if not size.strip().isdigit():
        raise HcclError(ht.HCCL_E_PARA, f"{JOB_ENV}={job!r} needs {WORLD_SIZE_ENV} (got {size!r})")
    return rendezvous(job, int(size))
