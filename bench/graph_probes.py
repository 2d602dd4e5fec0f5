"""The graph capture and replay probes (aclmdlRI), each a pyACL program run as its own
process like those of bench/probes.py, each measuring its baseline in the same process.

`python bench/graph_probes.py NAME [ARGS...]` runs one probe against the daemon at
SIMNPU_ADDRESS and prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time

from probes import builtin, check, launch, setup, struct_pack, value

import acl

GLOBAL = acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL


def _capture(stream, submit) -> int:
    """A model of what `submit()` puts on `stream` (and the streams it pulls in)."""
    check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
    submit()
    return value(acl.mdl.ri_capture_end(stream), "ri_capture_end")


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def replay_vs_eager(count: str = "1000", rounds: str = "15"):
    """`count` empty kernels on one stream, from the first submission to synchronize done:
    launched eagerly through acl, and as one replay of a graph that captured them. Best of
    `rounds`, the two taken in turn."""
    count, rounds = int(count), int(rounds)
    stream = setup()
    empty = builtin("empty")

    def launches() -> None:
        for _ in range(count):
            check(launch(empty, 1, stream), "launch")

    model = _capture(stream, launches)

    def eager() -> None:
        launches()
        check(acl.rt.synchronize_stream(stream), "synchronize")

    def replay() -> None:
        check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
        check(acl.rt.synchronize_stream(stream), "synchronize")

    eager(), replay()  # warm-up
    eager_s, replay_s = [], []
    for _ in range(rounds):
        eager_s.append(_timed(eager))
        replay_s.append(_timed(replay))
    check(acl.mdl.ri_destroy(model), "ri_destroy")
    return {"eager_s": min(eager_s), "replay_s": min(replay_s)}


def submit_cost(sizes: str = "10,1000,10000", batches: str = "5", batch: str = "21"):
    """Host CPU time (of the calling thread) of one aclmdlRIExecuteAsync for graphs of each
    size (empty kernels): `batches` runs of `batch` replays submitted back to back, then a
    synchronize; the mean over the replays but the first of each run (after the host slept in
    the synchronize its caches are cold, which costs any call several times its warm cost).
    Beside it the host CPU time of one eager launch, measured the same way."""
    stream = setup()
    empty = builtin("empty")
    batches, batch = int(batches), int(batch)

    def measured(call) -> float:
        spent = 0
        for _ in range(batches):
            for index in range(batch):
                start = time.thread_time_ns()
                call()
                if index:
                    spent += time.thread_time_ns() - start
            check(acl.rt.synchronize_stream(stream), "synchronize")
        return spent / (batches * (batch - 1)) / 1e3

    costs = {}
    for size in map(int, sizes.split(",")):

        def launches(size: int = size) -> None:
            for _ in range(size):
                check(launch(empty, 1, stream), "launch")

        model = _capture(stream, launches)
        costs[str(size)] = measured(
            lambda model=model: check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
        )
        check(acl.mdl.ri_destroy(model), "ri_destroy")
    eager = measured(lambda: check(launch(empty, 1, stream), "launch"))
    return {"replay_us": costs, "launch_us": eager}


def fork_join(elements: str = str(1 << 22), rounds: str = "3"):
    """A 4-stream fork/join: stream 0 forks to streams 1-3 by an event, each of the 4 runs
    two compute-bound kernels (exp, 1 block), streams 1-3 join back into 0. Wall time of
    the eager version, of one replay of its capture, and of the same 8 kernels on one
    stream (no overlap); best of `rounds`."""
    n, rounds = int(elements), int(rounds)
    streams = [setup()] + [value(acl.rt.create_stream()) for _ in range(3)]
    exp = builtin("exp_f32")
    inputs = [value(acl.rt.malloc(n * 4, 0)) for _ in range(4)]
    outputs = [value(acl.rt.malloc(n * 4, 0)) for _ in range(4)]
    for buffer in inputs:
        check(acl.rt.memset(buffer, n * 4, 0, n * 4), "memset")
    fork = value(acl.rt.create_event())
    joins = [value(acl.rt.create_event()) for _ in range(3)]

    def work(lane: int, stream) -> None:
        args = struct_pack("<QQI", inputs[lane], outputs[lane], n)
        for _ in range(2):
            check(launch(exp, 1, stream, args), "launch")

    def forked() -> None:
        origin = streams[0]
        check(acl.rt.record_event(fork, origin), "record_event")
        for other in streams[1:]:
            check(acl.rt.stream_wait_event(other, fork), "stream_wait_event")
        for lane, stream in enumerate(streams):
            work(lane, stream)
        for event, other in zip(joins, streams[1:]):
            check(acl.rt.record_event(event, other), "record_event")
            check(acl.rt.stream_wait_event(origin, event), "stream_wait_event")

    model = _capture(streams[0], forked)

    def eager() -> None:
        forked()
        check(acl.rt.synchronize_stream(streams[0]), "synchronize")

    def replay() -> None:
        check(acl.mdl.ri_execute_async(model, streams[0]), "ri_execute_async")
        check(acl.rt.synchronize_stream(streams[0]), "synchronize")

    def serial() -> None:
        for lane in range(4):
            work(lane, streams[0])
        check(acl.rt.synchronize_stream(streams[0]), "synchronize")

    eager(), replay()  # warm-up
    times: dict = {"eager_s": [], "replay_s": [], "serial_s": []}
    for _ in range(rounds):
        times["serial_s"].append(_timed(serial))
        times["eager_s"].append(_timed(eager))
        times["replay_s"].append(_timed(replay))
    check(acl.mdl.ri_destroy(model), "ri_destroy")
    for event in [fork, *joins]:
        check(acl.rt.destroy_event(event))
    for buffer in inputs + outputs:
        check(acl.rt.free(buffer))
    return {name: min(values) for name, values in times.items()}


PROBES = {f.__name__: f for f in (replay_vs_eager, submit_cost, fork_join)}

if __name__ == "__main__":
    result = PROBES[sys.argv[1]](*sys.argv[2:])
    acl.rt.reset_device(0)
    acl.finalize()
    print(json.dumps(result))
