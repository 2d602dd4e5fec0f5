"""The AI cores are shared between clients, not between streams (docs/architecture.md, "Fair
AI cores"): against a real daemon, a client whose many streams keep both cores busy with
long kernels does not make another client's small launches wait behind all of them."""

from __future__ import annotations

import json
import time

import numpy as np
from conftest import start_client

FLOOD_STREAMS = 8
FLOOD_DEPTH = 6  # launches queued on each stream
HOLD_MS = 100
VICTIM_LAUNCHES = 8

FLOODER = """
import json
import sys
import numpy as np
import simnpu.client as npu

SOURCE = '''
import time
from simnpu import kernel


@kernel("ptr", "u32", "u32")
def hold(ctx, starts, index, milliseconds):
    ctx.gm(starts + 8 * index, "int64", 1)[0] = time.monotonic_ns()
    time.sleep(milliseconds / 1000)
'''
with npu.Device(0) as device:
    hold = npu.Module.from_source(SOURCE, "hold.py").function("hold")
    count = STREAMS * DEPTH
    starts = npu.DeviceBuffer.from_array(np.zeros(count, np.int64))
    streams = [npu.Stream() for _ in range(STREAMS)]
    index = 0
    for _ in range(DEPTH):
        for stream in streams:
            hold.launch(1, starts, index, HOLD_MS, stream=stream)
            index += 1
    print("flooding", flush=True)
    device.synchronize()
    print(json.dumps(starts.to_numpy(np.int64).tolist()), flush=True)
"""


def test_a_clients_launches_wait_for_one_kernel_of_another_not_for_its_streams(daemon, npu):
    """Another client keeps both AI cores busy with 8 streams of 100 ms kernels, 6 queued
    on each (2.4 s of work per core). Each of this client's launches, from the call to its
    synchronize's return, sees at most 4 of the other's kernels start: the core it waits
    for goes to it next, and while it runs the other core may start one and then its own
    core the next; before that, each core may have started one while the launch was on its
    way to the daemon (both, when the other client's kernels run in step on the two cores,
    as they come to). Served by stream instead, it would wait behind the heads of all 8
    streams (and the runs queued behind them)."""
    flooder = start_client(
        daemon.address,
        FLOODER.replace("STREAMS", str(FLOOD_STREAMS))
        .replace("DEPTH", str(FLOOD_DEPTH))
        .replace("HOLD_MS", str(HOLD_MS)),
    )
    try:
        assert flooder.stdout.readline().strip() == "flooding", flooder.stderr.read()
        a = np.arange(1024, dtype=np.float32)
        add = npu.builtin("add_f32")
        windows = []
        with npu.Device(0):
            x, y, z = (npu.DeviceBuffer.from_array(v) for v in (a, 2 * a, np.zeros_like(a)))
            stream = npu.Stream()
            time.sleep(0.3)  # the other client's kernels hold both cores
            for _ in range(VICTIM_LAUNCHES):
                launched = time.monotonic_ns()
                add.launch(1, x, y, z, a.size, stream=stream)
                stream.synchronize(60_000)
                windows.append((launched, time.monotonic_ns()))
            assert np.array_equal(z.to_numpy(np.float32), 3 * a)
        output, errors = flooder.communicate(timeout=120)
    finally:
        if flooder.poll() is None:
            flooder.kill()
            flooder.communicate()
    assert flooder.returncode == 0, errors
    starts = json.loads(output.strip().splitlines()[-1])  # CLOCK_MONOTONIC, the device's clock
    assert all(starts), "every kernel of the other client ran"
    started_within = [sum(begin < s < end for s in starts) for begin, end in windows]
    assert max(started_within) <= 4, started_within
    # and the other client still had kernels queued on its streams after this client's last
    assert sum(start > windows[-1][1] for start in starts) >= FLOOD_STREAMS


SPANNING_FLOODER = """
import json
import numpy as np
import simnpu.client as npu

SOURCE = '''
import time
from simnpu import kernel


@kernel("ptr", "u32", "u32")
def hold(ctx, spans, index, milliseconds):
    start = time.monotonic_ns()
    time.sleep(milliseconds / 1000)
    ctx.gm(spans + 16 * index, "int64", 2)[:] = start, time.monotonic_ns()
'''
with npu.Device(0) as device:
    hold = npu.Module.from_source(SOURCE, "hold.py").function("hold")
    spans = npu.DeviceBuffer.from_array(np.zeros(2 * STREAMS * DEPTH, np.int64))
    streams = [npu.Stream() for _ in range(STREAMS)]
    for index in range(STREAMS * DEPTH):
        hold.launch(1, spans, index, HOLD_MS, stream=streams[index % STREAMS])
    print("flooding", flush=True)
    device.synchronize()
    print(json.dumps(spans.to_numpy(np.int64).reshape(-1, 2).tolist()), flush=True)
"""


def test_a_core_stays_free_for_a_client_active_on_the_device(start_daemon):
    """While another client counts as active on the device (it ran a kernel within the
    share window, here a minute), a client flooding 8 streams holds at most its share of
    the 2 AI cores, one: no two of its kernels handed out after the other became active
    run at once, and the free core is the other's. Served in turn only, the flood would
    refill both cores as they free."""
    daemon = start_daemon("--core-share-window-ms", "60000")
    flooder = start_client(
        daemon.address,
        SPANNING_FLOODER.replace("STREAMS", "8").replace("DEPTH", "3").replace("HOLD_MS", "100"),
    )
    import simnpu.client as npu

    npu.connect(daemon.address)
    try:
        assert flooder.stdout.readline().strip() == "flooding", flooder.stderr.read()
        a = np.arange(1024, dtype=np.float32)
        with npu.Device(0):
            x, y, z = (npu.DeviceBuffer.from_array(v) for v in (a, 2 * a, np.zeros_like(a)))
            npu.builtin("add_f32").launch(1, x, y, z, a.size)
            npu.current_stream().synchronize(60_000)
            active_from = time.monotonic_ns()  # it counts as active from its kernel's end
            assert np.array_equal(z.to_numpy(np.float32), 3 * a)
            output, errors = flooder.communicate(timeout=120)
    finally:
        if flooder.poll() is None:
            flooder.kill()
            flooder.communicate()
        npu.shutdown()
    assert flooder.returncode == 0, errors
    spans = json.loads(output.strip().splitlines()[-1])  # CLOCK_MONOTONIC, the device's clock
    assert all(start and end for start, end in spans), "every kernel of the other client ran"
    later = sorted((start, end) for start, end in spans if start > active_from)
    assert len(later) >= 8, f"the flood was over too soon: {len(later)} kernels after"
    overlapping = [(a, b) for a, b in zip(later, later[1:]) if b[0] < a[1]]
    assert not overlapping, f"{len(overlapping)} of its kernels ran beside another of its own"
