"""acl.mdl updates of captured models without recapture, against a real daemon: task groups
updated from another stream (inside a running replay and for later ones), task parameters read
and set, tasks disabled, aclmdlRIUpdate, kernel task attributes, and the codes of every refusal
(docs/graph-capture.md, "Updates")."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
from conftest import round_trip, runtime_of

from simnpu.client import facade
from simnpu.proto import commands

N = 256  # floats per buffer
NBYTES = N * 4


@pytest.fixture
def kit(acl):
    """Buffers, built-in kernels and launch helpers; everything made is freed after."""
    functions = {}
    for name in ("add_f32", "mul_f32"):
        functions[name], ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, name)
        assert ret == 0
    made: list[int] = []

    class Kit:
        add = functions["add_f32"]
        mul = functions["mul_f32"]

        def buffer(self, values=None):
            ptr, ret = acl.rt.malloc(NBYTES, 0)
            assert ret == 0
            made.append(ptr)
            self.write(ptr, np.zeros(N, np.float32) if values is None else values)
            return ptr

        def write(self, ptr, values):
            data = np.ascontiguousarray(values, np.float32).tobytes()
            assert acl.rt.memcpy(ptr, NBYTES, acl.util.bytes_to_ptr(data), NBYTES, 1) == 0

        def read(self, ptr):
            out = bytes(NBYTES)
            assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), NBYTES, ptr, NBYTES, 2) == 0
            return np.frombuffer(out, np.float32).copy()

        def args(self, x, y, z):
            return struct.pack("<QQQI4x", x, y, z, N)

        def launch(self, function, x, y, z, stream, blocks=1):
            args = self.args(x, y, z)
            return acl.rt.launch_kernel_with_host_args(
                function, blocks, stream, None, acl.util.bytes_to_ptr(args), len(args)
            )

    yield Kit()
    for ptr in made:
        acl.rt.free(ptr)


def _capture_group(acl, kit, stream, event, x, y, out):
    """The vendor's pattern: the model waits for an external event and resets it, then a task
    group of one add (out = x + y). (model, group)."""
    assert acl.mdl.ri_capture_begin(stream, acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED) == 0
    assert acl.rt.stream_wait_event(stream, event) == 0
    assert acl.rt.reset_event(event, stream) == 0
    assert acl.mdl.ri_capture_task_grp_begin(stream) == 0
    assert kit.launch(kit.add, x, y, out, stream) == 0
    group, ret = acl.mdl.ri_capture_task_grp_end(stream)
    assert ret == 0 and group
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0
    return model, group


def _tasks(acl, model):
    streams, ret = acl.mdl.ri_get_streams(model)
    assert ret == 0
    tasks, ret = acl.mdl.ri_get_tasks_by_stream(streams[0])
    assert ret == 0
    return tasks


def test_a_group_updated_from_another_stream_changes_the_running_replay_and_later_ones(acl, kit):
    stream, _ = acl.rt.create_stream()
    updater, _ = acl.rt.create_stream()
    event, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_EXTERNAL)
    assert ret == 0
    rng = np.random.default_rng(7)
    x, y, w = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    px, py, pw, out = kit.buffer(x), kit.buffer(y), kit.buffer(w), kit.buffer()
    model, group = _capture_group(acl, kit, stream, event, px, py, out)

    def replay(update):
        assert acl.mdl.ri_execute_async(model, stream) == 0
        if update is not None:  # while the replay waits for the event
            assert acl.mdl.ri_capture_task_update_begin(updater, group) == 0
            assert kit.launch(kit.mul if update == "mul" else kit.add, px, pw, out, updater) == 0
            assert acl.mdl.ri_capture_task_update_end(updater) == 0
        assert acl.rt.record_event(event, updater) == 0
        assert acl.rt.synchronize_stream(updater) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        return kit.read(out)

    assert np.array_equal(replay(None), x + y)
    assert np.array_equal(replay("add"), x + w)  # the replay submitted before the update
    assert np.array_equal(replay(None), x + w)  # and every later one
    assert np.array_equal(replay("mul"), x * w)  # another kernel in its place
    params, ret = acl.mdl.ri_task_get_params(_tasks(acl, model)[2])
    assert ret == 0
    kernel = params["kernel_task_params"]
    assert (params["type"], params["task_grp"]) == (acl.ACL_MODEL_RI_TASK_KERNEL, group)
    assert (kernel["func_handle"], kernel["num_blocks"], kernel["args_size"]) == (kit.mul, 1, 32)
    assert ctypes.string_at(kernel["args"], 32) == kit.args(px, pw, out)
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.mdl.ri_capture_task_update_begin(updater, group) == acl.ACL_ERROR_RT_INVALID_HANDLE
    for handle in (stream, updater):
        assert acl.rt.destroy_stream(handle) == 0
    assert acl.rt.destroy_event(event) == 0


def test_task_group_and_update_refusals(acl, kit):
    stream, _ = acl.rt.create_stream()
    other, _ = acl.rt.create_stream()
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    status = acl.ACL_ERROR_STREAM_TASK_GROUP_STATUS
    assert acl.mdl.ri_capture_task_grp_begin(stream) == acl.ACL_ERROR_RT_STREAM_NOT_CAPTURED
    assert acl.mdl.ri_capture_task_grp_end(stream) == (0, acl.ACL_ERROR_RT_STREAM_NOT_CAPTURED)
    assert acl.mdl.ri_capture_task_grp_begin(0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_capture_task_grp_end(0) == (0, acl.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    assert acl.mdl.ri_capture_task_grp_end(stream) == (0, status)  # none open
    assert acl.mdl.ri_capture_task_grp_begin(stream) == 0
    assert acl.mdl.ri_capture_task_grp_begin(stream) == status  # open already
    assert kit.launch(kit.add, x, x, out, stream) == 0
    assert kit.launch(kit.add, out, x, out, stream, blocks=2) == 0
    group, ret = acl.mdl.ri_capture_task_grp_end(stream)
    assert ret == 0
    # a stream in capture cannot update; nor can a group be updated by two streams at once
    assert acl.mdl.ri_capture_task_update_begin(stream, group) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    assert acl.mdl.ri_capture_task_update_end(stream) == acl.ACL_ERROR_RT_STREAM_CAPTURED
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0
    assert acl.mdl.ri_capture_task_update_begin(other, 0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_capture_task_update_begin(0, group) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_capture_task_update_begin(other, 0x1234) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_capture_task_update_end(other) == status  # not updating
    assert acl.mdl.ri_capture_task_update_begin(other, group) == 0
    assert acl.mdl.ri_capture_task_update_begin(other, group) == status
    assert acl.mdl.ri_capture_task_update_begin(stream, group) == status  # another's now
    # a stream updating a group that begins a capture cannot open a group in it
    assert acl.mdl.ri_capture_begin(other, 0) == 0
    assert acl.mdl.ri_capture_task_grp_begin(other) == status
    empty, ret = acl.mdl.ri_capture_end(other)
    assert ret == 0 and acl.mdl.ri_destroy(empty) == 0
    assert kit.launch(kit.add, x, x, out, other) == 0  # only one of the group's two
    assert acl.mdl.ri_capture_task_update_end(other) == acl.ACL_ERROR_RT_INTERNAL_ERROR
    assert acl.mdl.ri_capture_task_update_end(other) == status  # it ended all the same
    # one launch too many: that launch fails at the stream's synchronize, the update holds
    assert acl.mdl.ri_capture_task_update_begin(other, group) == 0
    for _ in range(3):
        assert kit.launch(kit.mul, x, x, out, other) == 0
    assert acl.mdl.ri_capture_task_update_end(other) == 0
    assert acl.rt.synchronize_stream(other) == acl.ACL_ERROR_RT_INTERNAL_ERROR
    assert "one more than it can update" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(other) == 0
    kit.write(out, np.full(N, 5.0))
    assert acl.mdl.ri_execute_async(model, stream) == 0  # out = 1 * 1, twice
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(kit.read(out), np.ones(N, np.float32))
    assert acl.mdl.ri_destroy(model) == 0
    for handle in (stream, other):
        assert acl.rt.destroy_stream(handle) == 0


def test_a_group_refuses_other_tasks_and_tasks_of_other_streams(acl, kit):
    stream, _ = acl.rt.create_stream()
    forked, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    assert acl.mdl.ri_capture_task_grp_begin(stream) == 0
    assert acl.rt.memset_async(out, NBYTES, 0, NBYTES, stream) == 0  # not a kernel
    assert acl.mdl.ri_capture_task_grp_end(stream) == (
        0,
        acl.ACL_ERROR_RT_TASK_TYPE_NOT_SUPPORT,
    )
    assert acl.mdl.ri_capture_end(stream)[1] == 0
    # a task of another stream of the capture while a group is open interrupts it
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.stream_wait_event(forked, event) == 0  # forked joins the capture
    assert acl.mdl.ri_capture_task_grp_begin(stream) == 0
    assert kit.launch(kit.add, x, x, out, stream) == 0
    assert kit.launch(kit.add, x, x, out, forked) == 0
    assert acl.mdl.ri_capture_task_grp_end(stream) == (0, acl.ACL_ERROR_STREAM_TASK_GROUP_INTR)
    assert acl.rt.record_event(event, forked) == 0
    assert acl.rt.stream_wait_event(stream, event) == 0
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0
    assert acl.mdl.ri_destroy(model) == 0
    # an invalidated capture's group has no handle
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    assert acl.mdl.ri_capture_task_grp_begin(stream) == 0
    # a command the daemon refuses (an event handle the raw layer did not check first)
    connection = facade.session().connection
    connection.send_command(commands.RecordEvent.pack(0x1234, stream), "here", stream)
    assert acl.mdl.ri_capture_task_grp_end(stream) == (
        0,
        acl.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
    )
    assert acl.mdl.ri_capture_end(stream)[1] == acl.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_INVALID_HANDLE  # the refusal
    assert acl.rt.synchronize_stream(stream) == 0
    for handle in (stream, forked):
        assert acl.rt.destroy_stream(handle) == 0
    assert acl.rt.destroy_event(event) == 0


def _add_model(acl, kit, stream, x, y, out):
    """A model of: value write, add, event record; its tasks."""
    event, _ = acl.rt.create_event()
    word, _ = acl.rt.malloc(64, 0)
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    assert acl.rt.value_write(word, 7, 0, stream) == 0
    assert kit.launch(kit.add, x, y, out, stream) == 0
    assert acl.rt.record_event(event, stream) == 0
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0
    return model, _tasks(acl, model), event, word


def test_set_params_and_update_change_a_kernel_bit_for_bit(acl, kit):
    stream, _ = acl.rt.create_stream()
    rng = np.random.default_rng(11)
    x, y, w = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    px, py, pw, out = kit.buffer(x), kit.buffer(y), kit.buffer(w), kit.buffer()
    model, (write, add, record), event, word = _add_model(acl, kit, stream, px, py, out)
    params, ret = acl.mdl.ri_task_get_params(add)
    assert ret == 0 and params["task_grp"] == 0
    kernel = params["kernel_task_params"]
    new_args = kit.args(px, pw, out)
    kernel.update(func_handle=kit.mul, args=acl.util.bytes_to_ptr(new_args), num_blocks=2)
    assert acl.mdl.ri_task_set_params(add, params) == 0
    assert acl.mdl.ri_execute_async(model, stream) == acl.ACL_ERROR_RT_MODEL_EXECUTE  # update
    assert acl.mdl.ri_execute(model, -1) == acl.ACL_ERROR_RT_MODEL_EXECUTE  # first
    assert acl.mdl.ri_update(model) == 0
    assert acl.mdl.ri_update(model) == 0  # ready: nothing to do
    assert acl.mdl.ri_execute_async(model, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert np.array_equal(kit.read(out), x * w)
    # arguments in device memory (is_host_args 0) are read at each replay
    device_args, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memcpy(device_args, 64, acl.util.bytes_to_ptr(kit.args(px, py, out)), 32, 1) == 0
    kernel.update(func_handle=kit.add, args=device_args, is_host_args=0, args_size=32)
    assert acl.mdl.ri_task_set_params(add, params) == 0
    assert acl.mdl.ri_update(model) == 0
    assert acl.mdl.ri_execute(model, -1) == 0
    assert np.array_equal(kit.read(out), x + y)
    # a value write's word and value
    value = {"dev_addr": word + 8, "value": 42}
    assert acl.mdl.ri_task_get_params(write) == (
        {
            "type": acl.ACL_MODEL_RI_TASK_VALUE_WRITE,
            "task_grp": 0,
            "op_info_ptr": 0,
            "op_info_size": 0,
            "value_write_task_params": {"dev_addr": word, "value": 7},
        },
        0,
    )
    write_params = {"type": acl.ACL_MODEL_RI_TASK_VALUE_WRITE, "value_write_task_params": value}
    assert acl.mdl.ri_task_set_params(write, write_params) == 0
    assert acl.mdl.ri_update(model) == 0
    assert acl.mdl.ri_execute(model, -1) == 0
    words = bytes(16)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(words), 16, word, 16, 2) == 0
    assert struct.unpack("<QQ", words) == (7, 42)  # the first replay's write, then this one's
    record_params, ret = acl.mdl.ri_task_get_params(record)
    assert ret == 0
    assert record_params["event_record_task_params"] == {
        "event": event,
        "event_flag": 0,
        "record_flag": 0,
    }
    assert acl.mdl.ri_destroy(model) == 0
    for ptr in (word, device_args):
        assert acl.rt.free(ptr) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_a_refused_change_faults_the_model(acl, kit):
    stream, _ = acl.rt.create_stream()
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    model, (write, add, record), event, word = _add_model(acl, kit, stream, x, x, out)
    params, _ = acl.mdl.ri_task_get_params(add)
    kernel = params["kernel_task_params"]
    invalid = acl.ACL_ERROR_RT_PARAM_INVALID
    # refusals before the model is touched
    assert acl.mdl.ri_task_set_params(0, params) == invalid
    assert acl.mdl.ri_task_set_params(0x1234, params) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_task_get_params(0) == ({}, invalid)
    assert acl.mdl.ri_task_disable(0) == invalid
    assert acl.mdl.ri_update(0) == invalid
    assert acl.mdl.ri_update(0x1234) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_execute(model, -1) == 0  # still ready
    # each of these is refused and faults the model
    wrong = [
        {**params, "type": acl.ACL_MODEL_RI_TASK_EVENT_RECORD},
        {**params, "task_grp": 5},
        {**params, "kernel_task_params": {**kernel, "func_handle": 0}},
        {**params, "kernel_task_params": {**kernel, "args": 0}},
        {**params, "kernel_task_params": {**kernel, "args_size": 0}},
        {**params, "kernel_task_params": {**kernel, "num_blocks": 0}},
    ]
    for bad in wrong:
        model, (write, add, record), event2, word2 = _add_model(acl, kit, stream, x, x, out)
        assert acl.mdl.ri_task_set_params(add, bad) == invalid, bad
        assert acl.mdl.ri_execute_async(model, stream) == acl.ACL_ERROR_RT_MODEL_EXECUTE
        assert acl.mdl.ri_update(model) == acl.ACL_ERROR_RT_MODEL_UPDATE_FAILED
        assert acl.mdl.ri_task_set_params(add, params) == acl.ACL_ERROR_RT_MODEL_UPDATE_FAILED
        assert acl.mdl.ri_destroy(model) == 0
        assert acl.rt.destroy_event(event2) == 0
        assert acl.rt.free(word2) == 0
    # a kernel's parameters on an event task, a DEFAULT task's: refused, faulted
    model, (write, add, record), event2, word2 = _add_model(acl, kit, stream, x, x, out)
    assert acl.mdl.ri_task_set_params(record, params) == invalid
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_event(event2) == 0
    assert acl.rt.free(word2) == 0
    # a task of type DEFAULT (a memset) has no parameters and cannot be disabled
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    assert acl.rt.memset_async(out, NBYTES, 0, NBYTES, stream) == 0
    model, ret = acl.mdl.ri_capture_end(stream)
    assert ret == 0
    (memset,) = _tasks(acl, model)
    assert acl.mdl.ri_task_get_params(memset) == ({}, invalid)
    assert acl.mdl.ri_execute(model, -1) == 0  # reading changed nothing
    assert acl.mdl.ri_task_disable(memset) == invalid
    assert acl.mdl.ri_update(model) == acl.ACL_ERROR_RT_MODEL_UPDATE_FAILED
    assert acl.mdl.ri_execute_async(model, stream) == acl.ACL_ERROR_RT_MODEL_EXECUTE
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.synchronize_stream(stream) == 0  # nothing was queued or rejected
    assert acl.rt.free(word) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_disable_update_and_changes_refused_while_captured_or_running(acl, kit):
    stream, _ = acl.rt.create_stream()
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    model, (write, add, record), event, word = _add_model(acl, kit, stream, x, x, out)
    assert acl.mdl.ri_task_disable(add) == 0
    assert acl.mdl.ri_execute(model, -1) == acl.ACL_ERROR_RT_MODEL_EXECUTE
    assert acl.mdl.ri_update(model) == 0
    assert acl.mdl.ri_execute(model, -1) == 0
    assert not kit.read(out).any()  # the add did not run
    params, _ = acl.mdl.ri_task_get_params(add)
    assert acl.mdl.ri_task_set_params(add, params) == 0  # setting parameters enables it again
    assert acl.mdl.ri_update(model) == 0
    assert acl.mdl.ri_execute(model, -1) == 0
    assert np.array_equal(kit.read(out), np.full(N, 2.0, np.float32))
    # a model being captured: aclmdlRIUpdate is 107040
    assert acl.mdl.ri_capture_begin(stream, 0) == 0
    _, capturing, _ = acl.mdl.ri_capture_get_info(stream)
    assert acl.mdl.ri_update(capturing) == acl.ACL_ERROR_RT_MODEL_UPDATE_FAILED
    assert acl.mdl.ri_capture_end(stream)[1] == 0
    assert acl.mdl.ri_destroy(capturing) == 0
    # while a replay is queued or runs (its stream held by a value wait)
    other, _ = acl.rt.create_stream()
    blocker, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset(blocker, 64, 0, 64) == 0
    assert acl.rt.value_wait(blocker, 1, acl.ACL_STREAM_WAIT_VALUE_EQ, stream) == 0
    assert acl.mdl.ri_execute_async(model, stream) == 0
    try:
        assert acl.mdl.ri_task_disable(add) == acl.ACL_ERROR_RT_MODEL_UPDATE_FAILED
        assert acl.mdl.ri_task_set_params(add, params) == acl.ACL_ERROR_RT_MODEL_UPDATE_FAILED
    finally:
        assert acl.rt.value_write(blocker, 1, 0, other) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.mdl.ri_task_disable(add) == 0  # not running any more
    assert acl.mdl.ri_destroy(model) == 0  # its tasks' handles go with it
    assert acl.mdl.ri_task_disable(add) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_task_get_params(add) == ({}, acl.ACL_ERROR_RT_INVALID_HANDLE)
    for ptr in (word, blocker):
        assert acl.rt.free(ptr) == 0
    assert acl.rt.destroy_event(event) == 0
    for handle in (stream, other):
        assert acl.rt.destroy_stream(handle) == 0


def test_kernel_task_attributes(acl, kit):
    stream, _ = acl.rt.create_stream()
    x, out = kit.buffer(np.ones(N)), kit.buffer()
    model, (write, add, record), event, word = _add_model(acl, kit, stream, x, x, out)
    get = acl.mdl.ri_kernel_task_get_attribute
    assert get(add, acl.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE) == ({"schem_mode": 0}, 0)
    assert get(add, acl.ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE) == ({"dyn_ubuf_size": 0}, 0)
    assert get(add, acl.ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP) == ({"is_data_dump": 0}, 0)
    (seconds, ret) = get(add, acl.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT)
    assert ret == 0 and seconds["timeout"] > 0
    micros, ret = get(add, acl.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US)
    assert ret == 0
    low, high = micros["timeout_us"]["timeout_low"], micros["timeout_us"]["timeout_high"]
    assert ((high << 32) | low) // 1_000_000 == seconds["timeout"]
    invalid = acl.ACL_ERROR_RT_PARAM_INVALID
    for attr in (
        acl.ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE,
        acl.ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET,
        acl.ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH,
        0,
        99,
    ):
        assert get(add, attr) == ({}, invalid)
    assert get(record, acl.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE) == ({}, invalid)
    assert get(0, 1) == ({}, acl.ACL_ERROR_INVALID_PARAM)
    assert get(0x1234, 1) == ({}, acl.ACL_ERROR_RT_INVALID_HANDLE)
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.free(word) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_another_client_is_unharmed(acl, kit, daemon):
    """A client's refused updates leave the daemon serving the next one."""
    stream, _ = acl.rt.create_stream()
    assert acl.mdl.ri_capture_task_update_begin(stream, 1 << 60) == acl.ACL_ERROR_RT_INVALID_HANDLE
    with runtime_of(daemon.address) as rt:
        round_trip(rt)
    assert acl.rt.destroy_stream(stream) == 0
