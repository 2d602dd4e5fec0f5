"""A client that may not share the daemon's /dev/shm: another container, another host.

It copies data to the device (pageable and pinned host memory), runs a kernel, copies the
result back and checks it against numpy; then prints whether its copies went through
shared memory or, because the daemon's segments are out of reach, as bytes inside the
gRPC stream. Both give the same results; only the speed differs.

    SIMNPU_ADDRESS=npu:50151 SIMNPU_TOKEN_FILE=/run/secrets/simnpu_token \
        python examples/remote_client.py

(docker-compose.yml's `remote` service). A daemon that refuses the client (wrong token)
makes it exit with status 3 and the ACL code on stderr.
"""

import sys

import numpy as np

import simnpu.client as npu

N = 1 << 20  # float32 elements: 4 MiB per buffer


def main() -> int:
    try:
        runtime = npu.connect()
        device = npu.Device(0)
    except npu.NpuError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 3
    print(
        f"connected to {runtime.connection.address}: "
        f"uses_shared_memory={runtime.memory.uses_shared_memory}",
        flush=True,
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal(N, dtype=np.float32)
    stream = npu.Stream()
    x = npu.DeviceBuffer.from_array(a)  # pageable memory
    pinned = npu.PinnedBuffer(a.nbytes)
    host = pinned.array(np.float32, (N,))
    host[:] = -a
    y = npu.DeviceBuffer(a.nbytes)
    y.copy_from_host(host, stream=stream)  # pinned memory, async
    z = npu.DeviceBuffer(a.nbytes)
    npu.builtin("add_f32").launch(4, x, x, z, N, stream=stream)  # z = 2a
    npu.builtin("add_f32").launch(4, z, y, z, N, stream=stream)  # z = 2a - a
    stream.synchronize()
    result = z.to_numpy(np.float32)
    assert np.array_equal(result, a), "the device computed something else"
    print(f"add_f32 over {N} float32 on {device}: matches numpy")
    del host  # no view may outlive the pinned memory
    stream.destroy()
    for buffer in (x, y, z, pinned):
        buffer.free()
    device.reset()
    npu.shutdown()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
