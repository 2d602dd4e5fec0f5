"""What the ranks of a world across hosts see when a host dies (docs/multihost.md).

One rank of a job (SIMNPU_JOB, SIMNPU_WORLD_SIZE, SIMNPU_JOB_SEED across hosts): it
all_reduces in a loop until a collective fails, then prints the failure, as
synchronize raised it and as HcclGetCommAsyncError keeps it. When another host's daemon
is killed, the failure names that host and its ranks:

    rank 1: all_reduce #37 failed: ACL_ERROR_RT_COMM_OP_RETRY_FAIL (507904): ... lost host
    host-b:50151 (ranks 4, 5, 6, 7): ...
    rank 1: HcclGetCommAsyncError: HCCL_E_REMOTE (21)

Exits 0 once such a failure came (the host loss was reported), 1 if the loop ended any
other way. The docker-compose.yml profile `multihost` runs it on both hosts and kills one.
"""

import sys

import numpy as np

import simnpu.client as npu
from simnpu.client.collectives import Communicator
from simnpu.client.rendezvous import from_env
from simnpu.proto.errors import NpuError

LOST_HOST = 507904  # ACL_ERROR_RT_COMM_OP_RETRY_FAIL: HCCL_E_REMOTE at synchronize


def say(line: str) -> None:
    """One line, in one write: the host's ranks share its output."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    me = from_env()
    assert me is not None, "run as one rank of a job: set SIMNPU_JOB and SIMNPU_WORLD_SIZE"
    npu.Device(me.rank % npu.device_count())
    comm = Communicator(me.world_size, me.root_info, me.rank)
    stream = npu.Stream()
    x = npu.DeviceBuffer.from_array(np.full(1 << 16, me.rank, np.float32))
    y = npu.DeviceBuffer(x.nbytes)
    say(f"rank {me.rank}: reducing")
    count = 0
    while True:
        comm.all_reduce(x, y, "sum", dtype=np.float32, stream=stream)
        try:
            stream.synchronize()
        except NpuError as error:
            say(f"rank {me.rank}: all_reduce #{count} failed: {error}")
            say(f"rank {me.rank}: HcclGetCommAsyncError: {comm.async_error()}")
            comm.destroy()
            return 0 if error.code == LOST_HOST and "lost host" in error.message else 1
        count += 1


if __name__ == "__main__":
    raise SystemExit(main())
