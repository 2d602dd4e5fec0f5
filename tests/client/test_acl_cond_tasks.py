"""acl.mdl conditional tasks against a real daemon: conditions, IF / WHILE / SWITCH cond tasks
and their sub models, the default value, failures, abort, the runtime's refusals and codes
(docs/graph-capture.md, "Conditional tasks")."""

from __future__ import annotations

import inspect
import json
import struct

import numpy as np
import pytest
from conftest import round_trip, runtime_of, start_client

N = 64  # floats per buffer
NBYTES = N * 4
KERNELS = """
from simnpu import kernel

@kernel("ptr", "ptr")
def countdown(ctx, cond, count):
    value = ctx.gm(cond, "uint64", 1)
    done = ctx.gm(count, "uint64", 1)
    value[0] -= 1
    done[0] += 1

@kernel("ptr")
def fails(ctx, x):
    raise ValueError("this branch always fails")
"""
IF, WHILE, SWITCH = 0, 1, 2


class Kit:
    """Buffers, the built-in add_f32 and the kernels above, for one test."""

    def __init__(self, acl):
        self.acl = acl
        self.add_f32, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
        assert ret == 0
        self.binary, ret = acl.rt.binary_load_from_data(KERNELS, None)
        assert ret == 0
        self.countdown, _ = acl.rt.binary_get_function(self.binary, "countdown")
        self.fails, _ = acl.rt.binary_get_function(self.binary, "fails")
        self.made: list[int] = []
        self.streams: list[int] = []

    def stream(self) -> int:
        stream, ret = self.acl.rt.create_stream()
        assert ret == 0
        self.streams.append(stream)
        return stream

    def buffer(self, values=None) -> int:
        ptr, ret = self.acl.rt.malloc(NBYTES, 0)
        assert ret == 0
        self.made.append(ptr)
        self.write(ptr, np.zeros(N, np.float32) if values is None else values)
        return ptr

    def write(self, ptr, values) -> None:
        data = np.ascontiguousarray(values, np.float32).tobytes()
        acl = self.acl
        assert acl.rt.memcpy(ptr, NBYTES, acl.util.bytes_to_ptr(data), NBYTES, 1) == 0

    def read(self, ptr) -> np.ndarray:
        out = bytes(NBYTES)
        acl = self.acl
        assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), NBYTES, ptr, NBYTES, 2) == 0
        return np.frombuffer(out, np.float32).copy()

    def set_word(self, ptr, value: int) -> None:
        data = struct.pack("<Q", value)
        acl = self.acl
        assert acl.rt.memcpy(ptr, 8, acl.util.bytes_to_ptr(data), 8, 1) == 0

    def word(self, ptr) -> int:
        out = bytes(8)
        acl = self.acl
        assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), 8, ptr, 8, 2) == 0
        return struct.unpack("<Q", out)[0]

    def add(self, x, y, z, stream) -> None:
        """z = x + y on `stream`."""
        args = struct.pack("<QQQI", x, y, z, N)
        ptr = self.acl.util.bytes_to_ptr(args)
        assert (
            self.acl.rt.launch_kernel_with_host_args(self.add_f32, 1, stream, None, ptr, len(args))
            == 0
        )

    def launch(self, function, stream, *pointers) -> None:
        args = struct.pack(f"<{len(pointers)}Q", *pointers)
        ptr = self.acl.util.bytes_to_ptr(args)
        assert (
            self.acl.rt.launch_kernel_with_host_args(function, 1, stream, None, ptr, len(args)) == 0
        )

    def close(self) -> None:
        for ptr in self.made:
            assert self.acl.rt.free(ptr) == 0
        for stream in self.streams:
            assert self.acl.rt.destroy_stream(stream) == 0
        assert self.acl.rt.binary_unload(self.binary) == 0


@pytest.fixture
def kit(acl):
    made = Kit(acl)
    yield made
    made.close()


def begin(acl, stream, model=0, mode=0):
    if model:
        ret = acl.mdl.ri_capture_to_model_ri_begin(stream, model, mode)
    else:
        ret = acl.mdl.ri_capture_begin(stream, mode)
    assert ret == 0, acl.get_recent_err_msg()
    _, captured, ret = acl.mdl.ri_capture_get_info(stream)
    assert ret == 0
    return captured


def end(acl, stream):
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0, acl.get_recent_err_msg()
    return model


def cond_model(acl, kit, kind, branches, flag=0, default=0, before=None):
    """A model whose one task is a cond task of `kind`; branches[i](sub_stream) records sub
    model i. `before(stream)` records tasks before the cond task. (model, cond pointer)."""
    stream, sub_stream = kit.stream(), kit.stream()
    parent = begin(acl, stream)
    if before is not None:
        before(stream, None)
    handle, ret = acl.mdl.ri_cond_handle_create(parent, default, flag)
    assert ret == 0, acl.get_recent_err_msg()
    pointer, ret = acl.mdl.ri_cond_handle_get_cond_ptr(handle)
    assert ret == 0 and pointer
    if before is not None:
        before(stream, pointer)
    params = {"handle": handle, "type": kind, "size": len(branches)}
    subs, ret = acl.mdl.ri_add_cond_task(params, stream, 0)
    assert ret == 0, acl.get_recent_err_msg()
    assert len(subs) == len(branches) and all(subs)
    for sub, branch in zip(subs, branches):
        assert begin(acl, sub_stream, sub) == sub
        branch(sub_stream)
        assert end(acl, sub_stream) == sub
    assert end(acl, stream) == parent
    return parent, pointer


def run(acl, model, stream) -> int:
    assert acl.mdl.ri_execute_async(model, stream) == 0
    return acl.rt.synchronize_stream(stream)


# ---- the three types -------------------------------------------------------------------------
def test_if_runs_the_branch_the_condition_chooses(acl, kit):
    x, y = kit.buffer(np.arange(N)), kit.buffer(np.ones(N))
    out_true, out_false = kit.buffer(), kit.buffer()
    model, cond = cond_model(
        acl,
        kit,
        IF,
        [lambda s: kit.add(x, y, out_true, s), lambda s: kit.add(x, x, out_false, s)],
    )
    assert kit.word(cond) == 0  # a new condition is 0
    stream = kit.stream()
    kit.set_word(cond, 7)
    assert run(acl, model, stream) == 0
    assert np.array_equal(kit.read(out_true), np.arange(N) + 1.0)
    assert not kit.read(out_false).any()
    kit.set_word(cond, 0)
    assert run(acl, model, stream) == 0
    assert np.array_equal(kit.read(out_false), 2.0 * np.arange(N))
    assert kit.word(cond) == 0  # replays leave it alone (flag 0)
    assert acl.mdl.ri_execute(model, -1) == 0  # blocking replays choose too
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.mdl.ri_cond_handle_get_cond_ptr(1)[1] == acl.ACL_ERROR_RT_INVALID_HANDLE


def test_only_a_sub_model_never_captured_takes_a_capture_and_none_is_updated(acl, kit):
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    stream, sub_stream = kit.stream(), kit.stream()
    parent = begin(acl, stream)
    handle, _ = acl.mdl.ri_cond_handle_create(parent, 0, 0)
    (sub,), ret = acl.mdl.ri_add_cond_task({"handle": handle, "type": IF, "size": 1}, stream, 0)
    assert ret == 0
    # the parent is being captured: no capture into it
    assert acl.mdl.ri_capture_to_model_ri_begin(sub_stream, parent, 0) == (
        acl.ACL_ERROR_RT_MODEL_CAPTURED
    )
    assert begin(acl, sub_stream, sub) == sub
    kit.add(x, x, out, sub_stream)
    assert end(acl, sub_stream) == sub
    assert acl.mdl.ri_capture_to_model_ri_begin(sub_stream, sub, 0) == (  # captured once
        acl.ACL_ERROR_RT_MODEL_CAPTURED
    )
    assert end(acl, stream) == parent
    assert acl.mdl.ri_capture_to_model_ri_begin(sub_stream, parent, 0) == (
        acl.ACL_ERROR_RT_MODEL_CAPTURED
    )
    assert acl.mdl.ri_update(sub) == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.mdl.ri_update(parent) == 0  # ready: nothing to do
    assert acl.mdl.ri_destroy(parent) == 0


def test_if_with_one_branch_and_a_false_condition_runs_nothing(acl, kit):
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    model, cond = cond_model(acl, kit, IF, [lambda s: kit.add(x, x, out, s)])
    stream = kit.stream()
    assert run(acl, model, stream) == 0
    assert not kit.read(out).any()
    kit.set_word(cond, 1)
    assert run(acl, model, stream) == 0
    assert np.array_equal(kit.read(out), np.full(N, 2.0, np.float32))
    assert acl.mdl.ri_destroy(model) == 0


def test_while_runs_its_body_until_the_condition_is_0(acl, kit):
    count, ret = acl.rt.malloc(8, 0)
    assert ret == 0
    kit.made.append(count)
    x, y = kit.buffer(np.arange(N)), kit.buffer()
    holder = {}

    def body(stream):
        kit.add(x, y, y, stream)  # y += x
        kit.launch(kit.countdown, stream, holder["cond"], count)  # cond -= 1, count += 1

    def before(stream, pointer):
        if pointer is not None:
            holder["cond"] = pointer

    model, cond = cond_model(acl, kit, WHILE, [body], before=before)
    stream = kit.stream()
    for rounds in (5, 0, 3):
        kit.set_word(count, 0)
        kit.write(y, np.zeros(N))
        kit.set_word(cond, rounds)
        assert run(acl, model, stream) == 0
        assert kit.word(count) == rounds
        assert kit.word(cond) == 0
        assert np.array_equal(kit.read(y), rounds * np.arange(N, dtype=np.float32))
    assert acl.mdl.ri_destroy(model) == 0


def test_switch_runs_the_branch_of_the_value_and_none_out_of_range(acl, kit):
    x = kit.buffer(np.arange(N))
    outs = [kit.buffer() for _ in range(3)]
    branches = [lambda s, out=out: kit.add(x, x, out, s) for out in outs]
    model, cond = cond_model(acl, kit, SWITCH, branches)
    stream = kit.stream()
    for value in range(3):
        kit.set_word(cond, value)
        assert run(acl, model, stream) == 0
        for index, out in enumerate(outs):
            ran = index <= value
            assert kit.read(out).any() == ran, (value, index)
    for out in outs:
        kit.write(out, np.zeros(N))
    for value in (3, 1 << 40):
        kit.set_word(cond, value)
        assert run(acl, model, stream) == 0
    assert not any(kit.read(out).any() for out in outs)
    assert acl.mdl.ri_destroy(model) == 0


def test_assign_default_sets_the_condition_when_a_replay_is_submitted(acl, kit):
    """As the runtime (at aclmdlRIExecuteAsync): a value written before the call is lost; one
    written by a task of the graph before the cond task counts."""
    x = kit.buffer(np.arange(N))
    out_true, out_false = kit.buffer(), kit.buffer()
    branches = [lambda s: kit.add(x, x, out_true, s), lambda s: kit.add(x, x, out_false, s)]
    model, cond = cond_model(acl, kit, IF, branches, acl.ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT)
    stream = kit.stream()
    kit.set_word(cond, 1)
    assert run(acl, model, stream) == 0  # reset to its default 0: the false branch
    assert kit.read(out_false).any() and not kit.read(out_true).any()
    assert kit.word(cond) == 0
    assert acl.mdl.ri_destroy(model) == 0

    one, ret = acl.rt.malloc(8, 0)
    kit.made.append(one)
    kit.set_word(one, 1)
    kit.write(out_false, np.zeros(N))

    def before(stream, pointer):  # the graph itself sets the condition to 1
        if pointer is not None:
            assert acl.rt.memcpy_async(pointer, 8, one, 8, 3, stream) == 0

    model, cond = cond_model(acl, kit, IF, branches, 1, default=0, before=before)
    assert run(acl, model, stream) == 0
    assert kit.read(out_true).any() and not kit.read(out_false).any()
    assert acl.mdl.ri_destroy(model) == 0

    kit.write(out_true, np.zeros(N))
    model, cond = cond_model(acl, kit, IF, branches, 1, default=5)
    kit.set_word(cond, 0)
    assert run(acl, model, stream) == 0  # set to 5: the true branch
    assert kit.read(out_true).any() and not kit.read(out_false).any()
    assert kit.word(cond) == 5
    assert acl.mdl.ri_destroy(model) == 0


def test_nested_cond_tasks_and_introspection(acl, kit, tmp_path):
    """An IF whose true branch holds a SWITCH; the parent lists its cond task as a task of
    type ACL_MODEL_RI_TASK_DEFAULT."""
    x = kit.buffer(np.arange(N))
    outs = [kit.buffer() for _ in range(2)]
    stream, sub_stream, inner_stream = kit.stream(), kit.stream(), kit.stream()
    parent = begin(acl, stream)
    outer, _ = acl.mdl.ri_cond_handle_create(parent, 0, 0)
    outer_ptr, _ = acl.mdl.ri_cond_handle_get_cond_ptr(outer)
    (branch,), ret = acl.mdl.ri_add_cond_task({"handle": outer, "type": IF, "size": 1}, stream, 0)
    assert ret == 0
    begin(acl, sub_stream, branch)
    inner, ret = acl.mdl.ri_cond_handle_create(branch, 0, 0)
    assert ret == 0
    inner_ptr, _ = acl.mdl.ri_cond_handle_get_cond_ptr(inner)
    cases, ret = acl.mdl.ri_add_cond_task(
        {"handle": inner, "type": SWITCH, "size": 2}, sub_stream, 0
    )
    assert ret == 0
    for case, out in zip(cases, outs):
        begin(acl, inner_stream, case)
        kit.add(x, x, out, inner_stream)
        end(acl, inner_stream)
    end(acl, sub_stream)
    assert end(acl, stream) == parent
    exec_stream = kit.stream()
    kit.set_word(outer_ptr, 1)
    kit.set_word(inner_ptr, 1)
    assert run(acl, parent, exec_stream) == 0
    assert not kit.read(outs[0]).any() and kit.read(outs[1]).any()
    kit.set_word(outer_ptr, 0)
    kit.set_word(inner_ptr, 0)
    assert run(acl, parent, exec_stream) == 0
    assert not kit.read(outs[0]).any()

    streams, ret = acl.mdl.ri_get_streams(parent)
    assert ret == 0 and len(streams) == 1
    tasks, ret = acl.mdl.ri_get_tasks_by_stream(streams[0])
    assert ret == 0 and len(tasks) == 1
    assert acl.mdl.ri_task_get_type(tasks[0]) == (acl.ACL_MODEL_RI_TASK_DEFAULT, 0)
    path = tmp_path / "model.json"
    assert acl.mdl.ri_debug_json_print(parent, str(path), 1) == 0
    (task,) = json.loads(path.read_text())["streams"][0]["task_list"]
    assert (task["kind"], task["name"]) == ("cond", "cond IF")
    assert acl.mdl.ri_destroy(parent) == 0
    for handle in (branch, case):  # the sub models went with it
        assert acl.mdl.ri_get_id(handle)[1] == acl.ACL_ERROR_RT_INVALID_HANDLE


# ---- failures, abort, a killed client -----------------------------------------------------------
def test_a_failing_task_in_a_branch_fails_the_replay(acl, kit):
    x = kit.buffer()
    model, cond = cond_model(acl, kit, IF, [lambda s: kit.launch(kit.fails, s, x)])
    stream = kit.stream()
    kit.set_word(cond, 1)
    assert run(acl, model, stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    message = acl.get_recent_err_msg()
    assert "this branch always fails" in message
    lines, first = inspect.getsourcelines(Kit.launch)
    line = first + next(i for i, text in enumerate(lines) if "(function," in text)
    assert f"test_acl_cond_tasks.py:{line}" in message, message  # where it was captured
    assert acl.rt.synchronize_stream(stream) == 0  # reported once
    kit.set_word(cond, 0)
    assert run(acl, model, stream) == 0
    assert acl.mdl.ri_destroy(model) == 0


def test_abort_ends_an_endless_while(acl, kit):
    x, y = kit.buffer(np.ones(N)), kit.buffer()
    model, cond = cond_model(acl, kit, WHILE, [lambda s: kit.add(x, y, y, s)])
    stream = kit.stream()
    kit.set_word(cond, 1)  # never changes: the loop never ends by itself
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.mdl.ri_get_id(model)[1] == 0  # answered once the replay started
    assert acl.mdl.ri_abort(model) == 0
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_MODEL_ABORT_NORMAL
    assert kit.word(cond) == 1
    kit.set_word(cond, 0)
    assert run(acl, model, stream) == 0
    assert acl.mdl.ri_destroy(model) == 0


KILLED_CLIENT = """
import struct, time
import acl

acl.init()
acl.rt.set_device(0)
add, _ = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
stream, _ = acl.rt.create_stream()
sub_stream, _ = acl.rt.create_stream()
x, _ = acl.rt.malloc(256, 0)
acl.rt.memset(x, 256, 0, 256)
acl.mdl.ri_capture_begin(stream, 0)
_, parent, _ = acl.mdl.ri_capture_get_info(stream)
handle, _ = acl.mdl.ri_cond_handle_create(parent, 1, 1)
(body,), ret = acl.mdl.ri_add_cond_task({"handle": handle, "type": 1, "size": 1}, stream, 0)
assert ret == 0
acl.mdl.ri_capture_to_model_ri_begin(sub_stream, body, 0)
args = struct.pack("<QQQI", x, x, x, 64)
ptr = acl.util.bytes_to_ptr(args)
acl.rt.launch_kernel_with_host_args(add, 1, sub_stream, None, ptr, len(args))
acl.mdl.ri_capture_end(sub_stream)
model, ret = acl.mdl.ri_capture_end(stream)
assert ret == 0
acl.mdl.ri_execute_async(model, stream)
acl.mdl.ri_get_id(model)  # answered once the replay runs
print("looping", flush=True)
time.sleep(300)
"""


def test_a_client_killed_in_an_endless_while_leaves_nothing(daemon):
    """Its loop ends with its session; the daemon serves the next client (the conftest
    checks that no segment or process is left)."""
    process = start_client(daemon.address, KILLED_CLIENT)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "looping", process.stderr.read()
    finally:
        process.kill()
        process.wait(30)
    with runtime_of(daemon.address) as rt:
        round_trip(rt)


# ---- refusals ------------------------------------------------------------------------------------
def test_refusals_with_the_runtimes_codes(acl, kit, daemon):
    a = acl
    stream, other, sub_stream = kit.stream(), kit.stream(), kit.stream()
    # aclmdlRICondHandleCreate
    assert a.mdl.ri_cond_handle_create(0, 0, 0) == (0, a.ACL_ERROR_INVALID_PARAM)
    assert a.mdl.ri_cond_handle_create(12345, 0, 0) == (0, a.ACL_ERROR_RT_INVALID_HANDLE)
    parent = begin(a, stream)
    assert a.mdl.ri_cond_handle_create(parent, 0, 2) == (0, a.ACL_ERROR_RT_PARAM_INVALID)
    built, ret = a.mdl.ri_build_begin(0)
    assert ret == 0
    assert a.mdl.ri_cond_handle_create(built, 0, 0) == (0, a.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    assert a.mdl.ri_destroy(built) == 0
    handle, ret = a.mdl.ri_cond_handle_create(parent, 0, 0)
    assert ret == 0
    # aclmdlRICondHandleGetCondPtr
    assert a.mdl.ri_cond_handle_get_cond_ptr(0) == (0, a.ACL_ERROR_INVALID_PARAM)
    assert a.mdl.ri_cond_handle_get_cond_ptr(99) == (0, a.ACL_ERROR_RT_INVALID_HANDLE)
    # aclmdlRIAddCondTask
    good = {"handle": handle, "type": IF, "size": 2}
    add = a.mdl.ri_add_cond_task
    assert add(good, 0, 0) == ([], a.ACL_ERROR_INVALID_PARAM)
    assert add(None, stream, 0) == ([], a.ACL_ERROR_INVALID_PARAM)
    assert add({**good, "type": 3}, stream, 0) == ([], a.ACL_ERROR_RT_PARAM_INVALID)
    assert add(good, stream, 1) == ([], a.ACL_ERROR_RT_PARAM_INVALID)
    assert add({**good, "handle": 0}, stream, 0) == ([], a.ACL_ERROR_RT_PARAM_INVALID)
    assert add({**good, "handle": 77}, stream, 0) == ([], a.ACL_ERROR_RT_INVALID_HANDLE)
    for kind, size in ((IF, 0), (IF, 3), (WHILE, 0), (WHILE, 2), (SWITCH, 0)):
        params = {"handle": handle, "type": kind, "size": size}
        assert add(params, stream, 0) == ([], a.ACL_ERROR_RT_PARAM_INVALID), (kind, size)
    huge = {"handle": handle, "type": SWITCH, "size": (1 << 32) - 1}
    assert add(huge, stream, 0) == ([], a.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)  # not simulated
    assert add(good, other, 0) == ([], a.ACL_ERROR_RT_STREAM_NOT_CAPTURED)
    second = begin(a, other)  # captured into another model than the handle's
    assert add(good, other, 0) == ([], a.ACL_ERROR_RT_PARAM_INVALID)
    assert end(a, other) == second
    assert a.mdl.ri_destroy(second) == 0
    # none of that invalidated the capture; the handle is still unused
    assert a.mdl.ri_capture_get_info(stream) == (a.ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE, parent, 0)
    (first, later), ret = add(good, stream, 0)
    assert ret == 0
    assert add(good, stream, 0) == ([], a.ACL_ERROR_RT_PARAM_INVALID)  # used already
    # a sub model runs and goes only with its model
    for call in (a.mdl.ri_destroy, a.mdl.ri_abort):
        assert call(first) == a.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert a.mdl.ri_execute_async(first, other) == a.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert a.mdl.ri_get_streams(first) == ([], a.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    # a sub model not captured (or still capturing) keeps the model's capture from ending
    begin(a, sub_stream, first)
    end(a, sub_stream)
    begin(a, sub_stream, later)
    assert a.mdl.ri_capture_end(stream) == (0, a.ACL_ERROR_RT_SUB_ACLGRAPH_IS_CAPTURING)
    assert a.mdl.ri_capture_get_info(stream) == (a.ACL_MODEL_RI_CAPTURE_STATUS_NONE, 0, 0)
    assert a.mdl.ri_get_id(parent)[1] == a.ACL_ERROR_RT_INVALID_HANDLE  # gone with its subs
    assert a.mdl.ri_get_id(first)[1] == a.ACL_ERROR_RT_INVALID_HANDLE
    assert a.mdl.ri_capture_end(sub_stream) == (0, a.ACL_ERROR_RT_STREAM_NOT_CAPTURED)
    # a model whose capture ended takes no new condition
    parent = begin(a, stream)
    assert end(a, stream) == parent
    assert a.mdl.ri_cond_handle_create(parent, 0, 0) == (0, a.ACL_ERROR_RT_PARAM_INVALID)
    assert a.mdl.ri_destroy(parent) == 0
    # another client was not harmed
    with runtime_of(daemon.address) as rt:
        round_trip(rt)


def test_cond_tasks_replay_the_same_traced_and_checked(daemon, tmp_path):
    """Under SIMNPU_TRACE and SIMNPU_CHECK the sub models' tasks run on streams the observer
    has not seen before a replay: the results are the same, and a buffer a sub model read is
    freed without a finding once the replaying stream was synchronized."""
    from cann_examples import run_cann_example

    program = "2_advanced_features/model_ri/3_cond_model.py"
    plain = run_cann_example(daemon.address, program)
    report = tmp_path / "check.txt"
    for env in (
        {"SIMNPU_TRACE": str(tmp_path / "trace.json")},
        {"SIMNPU_CHECK": "memcheck", "SIMNPU_CHECK_REPORT": str(report)},
    ):
        assert run_cann_example(daemon.address, program, env=env) == plain, env
    assert (tmp_path / "trace.json").stat().st_size > 0
    assert "use-after-free" not in (report.read_text() if report.exists() else "")
