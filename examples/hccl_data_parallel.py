"""Data-parallel training on the simulated NPU: 4 processes, one rank each.

Every step, each rank runs the forward pass of a linear model on its shard of the batch
(the built-in matmul kernel), computes its local gradient (a kernel of this file), sums
the gradients of all ranks with an HCCL all_reduce on the same stream, and applies the
SGD update (another kernel) -- no host synchronisation inside the loop: stream order does
it. At the end every rank's weights must be bit-for-bit the same, and match a
single-process numpy run of full-batch gradient descent.

    python examples/hccl_data_parallel.py

Runs against the daemon at SIMNPU_ADDRESS, or at the per-user socket, starting one there
(with 4 devices) if none runs. Rank r uses device r % device count: with as many devices
as ranks each rank has its own, as on hardware; otherwise ranks share devices (a simnpu extension).

As one rank of a job (a container replica: docker-compose.yml's `rank` service):

    SIMNPU_JOB=train SIMNPU_WORLD_SIZE=4 python examples/hccl_data_parallel.py

The process is then a single rank: it gets its rank and the root info from the daemon's
job rendezvous (simnpu.client.rendezvous), trains on its shard of the batch (any world
size), checks with an all_gather that every rank holds the same weights, compares them
with the numpy reference, and prints whether its copies went through shared memory.
"""

import multiprocessing
import os

import numpy as np

RANKS = 4
STEPS = 20
BATCH, D_IN, D_OUT = 512, 64, 16  # the whole batch; each rank holds BATCH // RANKS rows
LEARNING_RATE = 2.0

KERNELS = '''
import numpy as np
from simnpu import kernel


@kernel("ptr", "ptr", "ptr", "ptr", "u32", "u32", "u32", "f32")
def gradient(ctx, x, p, y, g, m, k, n, scale):
    """g = scale * x^T (p - y): the local gradient of the squared error of p = x w."""
    X = ctx.gm(x, "float32", m * k, "r").reshape(m, k)
    P = ctx.gm(p, "float32", m * n, "r").reshape(m, n)
    error = P - ctx.gm(y, "float32", m * n, "r").reshape(m, n)
    np.multiply(X.T @ error, np.float32(scale), out=ctx.gm(g, "float32", k * n).reshape(k, n))


@kernel("ptr", "ptr", "u32", "f32")
def sgd(ctx, w, g, n, learning_rate):
    """w -= learning_rate * g"""
    W = ctx.gm(w, "float32", n)
    W -= np.float32(learning_rate) * ctx.gm(g, "float32", n, "r")
'''


def dataset():
    rng = np.random.default_rng(42)
    x = rng.standard_normal((BATCH, D_IN), dtype=np.float32)
    true_w = rng.standard_normal((D_IN, D_OUT), dtype=np.float32)
    y = (x @ true_w + 0.01 * rng.standard_normal((BATCH, D_OUT), dtype=np.float32)).astype(
        np.float32
    )
    w0 = np.zeros((D_IN, D_OUT), np.float32)
    return x, y, w0


def rank_main(rank, root_info_queue, results):
    import simnpu.client as npu
    from simnpu.client.collectives import Communicator, get_root_info

    device = rank % npu.device_count()
    npu.Device(device)
    if rank == 0:
        root_info = get_root_info()
        for _ in range(RANKS - 1):
            root_info_queue.put(root_info)
    else:
        root_info = root_info_queue.get()
    with Communicator(RANKS, root_info, rank) as comm:
        results.put((rank, device, train(npu, comm)))


def train(npu, comm):
    """This rank's part of the training; the final weights (host array)."""
    x, y, w0 = dataset()
    first, end = BATCH * comm.rank // comm.size, BATCH * (comm.rank + 1) // comm.size
    mine, rows = slice(first, end), end - first  # near-equal shards for any number of ranks
    stream = npu.Stream()
    x_dev = npu.DeviceBuffer.from_array(x[mine])
    y_dev = npu.DeviceBuffer.from_array(y[mine])
    w_dev = npu.DeviceBuffer.from_array(w0)
    p_dev = npu.DeviceBuffer(rows * D_OUT * 4)
    g_dev = npu.DeviceBuffer(D_IN * D_OUT * 4)
    module = npu.Module.from_source(KERNELS, "data_parallel_kernels.py")
    forward, gradient, sgd = (
        npu.builtin("matmul_f32"),
        module.function("gradient"),
        module.function("sgd"),
    )
    scale = 2.0 / (BATCH * D_OUT)  # of the mean squared error over the whole batch
    for _ in range(STEPS):
        forward.launch(1, x_dev, w_dev, p_dev, rows, D_IN, D_OUT, stream=stream)  # p = x w
        gradient.launch(1, x_dev, p_dev, y_dev, g_dev, rows, D_IN, D_OUT, scale, stream=stream)
        comm.all_reduce(g_dev, op="sum", dtype=np.float32, stream=stream)  # sum over ranks
        sgd.launch(1, w_dev, g_dev, D_IN * D_OUT, LEARNING_RATE, stream=stream)
    stream.synchronize()
    return w_dev.to_numpy(np.float32, (D_IN, D_OUT))


def reference():
    """Full-batch gradient descent in one process, with numpy."""
    x, y, w = dataset()
    scale = np.float32(2.0 / (BATCH * D_OUT))
    losses = []
    for _ in range(STEPS):
        error = x @ w - y
        losses.append(float(np.mean(error**2)))
        w = w - np.float32(LEARNING_RATE) * ((x.T @ error) * scale)
    return w, losses


def job_main():
    """One rank of a job whose processes meet through the daemon (SIMNPU_JOB is set)."""
    import simnpu.client as npu
    from simnpu.client.collectives import Communicator
    from simnpu.client.rendezvous import from_env

    print(
        f"waiting for {os.environ.get('SIMNPU_WORLD_SIZE')} processes of job "
        f"{os.environ['SIMNPU_JOB']!r} (SIMNPU_WORLD_SIZE)",
        flush=True,
    )
    me = from_env()  # blocks until SIMNPU_WORLD_SIZE processes of the job have asked
    device = me.rank % npu.device_count()
    npu.Device(device)
    print(
        f"rank {me.rank}/{me.world_size} of job {me.job!r} on device {device}, pid {os.getpid()}: "
        f"uses_shared_memory={npu.runtime().memory.uses_shared_memory}",
        flush=True,
    )
    with Communicator(me.world_size, me.root_info, me.rank) as comm:
        weights = train(npu, comm)
        everyone = comm.all_gather_array(weights)  # every rank's weights, to compare
    expected, losses = reference()
    identical = all(w.tobytes() == weights.tobytes() for w in everyone)
    difference = float(np.max(np.abs(weights - expected)))
    print(f"loss of the reference run: {losses[0]:.4f} -> {losses[-1]:.4f} after {STEPS} steps")
    print(f"every rank's weights identical bit for bit: {identical}")
    print(f"largest difference from the single-process numpy reference: {difference:.2e}")
    assert identical and np.allclose(weights, expected, rtol=1e-4, atol=1e-5), (
        "data-parallel run diverged"
    )
    print(f"rank {me.rank}: ok")


def main():
    if os.environ.get("SIMNPU_JOB"):
        return job_main()
    os.environ.setdefault("SIMNPU_DEVICES", str(RANKS))  # for a daemon started on demand
    spawn = multiprocessing.get_context("spawn")
    root_info_queue, results = spawn.Queue(), spawn.Queue()
    ranks = [
        spawn.Process(target=rank_main, args=(r, root_info_queue, results)) for r in range(RANKS)
    ]
    for process in ranks:
        process.start()
    weights = {}
    try:
        for _ in range(RANKS):
            rank, device, w = results.get(timeout=300)
            weights[rank] = w
            print(f"rank {rank} on device {device}: done")
    finally:
        for process in ranks:
            process.join(60)
    expected, losses = reference()
    print(f"loss of the reference run: {losses[0]:.4f} -> {losses[-1]:.4f} after {STEPS} steps")
    identical = all(weights[r].tobytes() == weights[0].tobytes() for r in weights)
    difference = float(np.max(np.abs(weights[0] - expected)))
    print(f"every rank's weights identical bit for bit: {identical}")
    print(f"largest difference from the single-process numpy reference: {difference:.2e}")
    assert identical and np.allclose(weights[0], expected, rtol=1e-4, atol=1e-5), (
        "data-parallel run diverged"
    )
    print("ok")


if __name__ == "__main__":
    main()
