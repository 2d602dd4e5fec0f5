"""Explicitly built models through acl as a pyACL program calls them: aclmdlRIBuildBegin,
BindStream, EndTask, BuildEnd, UnbindStream, aclrtActiveStream, aclrtSwitchStream and
labels (docs/model-build.md), against a real daemon."""

from __future__ import annotations

import ctypes
import struct

import pytest

from simnpu.proto import codes


@pytest.fixture
def acl(daemon, monkeypatch):
    monkeypatch.setenv("SIMNPU_ADDRESS", daemon.address)
    import acl

    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    yield acl
    assert acl.rt.reset_device_force(0) == 0
    assert acl.finalize() == 0


def persistent(acl):
    stream, ret = acl.rt.create_stream_with_config(0, acl.ACL_STREAM_PERSISTENT)
    assert ret == 0
    return stream


def word(acl, value, size=4):
    addr, ret = acl.rt.malloc(8, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == 0
    data = struct.pack("<q", value)[:size].ljust(8, b"\0")
    assert acl.rt.memcpy(addr, 8, acl.util.bytes_to_ptr(data), 8, 1) == 0
    return addr


def read(acl, addr):
    out = ctypes.c_int64()
    assert acl.rt.memcpy(ctypes.addressof(out), 8, addr, 8, 2) == 0
    return out.value


def test_bind_refusals_and_codes(acl):
    plain, ret = acl.rt.create_stream()
    stream = persistent(acl)
    model, ret = acl.mdl.ri_build_begin(0)
    assert ret == 0 and model
    assert acl.mdl.ri_build_begin(1)[1] == codes.ACL_ERROR_RT_PARAM_INVALID
    # a built model is not a captured one: no capture into it, no aclmdlRIUpdate
    assert acl.mdl.ri_capture_to_model_ri_begin(plain, model, 0) == (
        codes.ACL_ERROR_RT_MODEL_CAPTURED
    )
    assert acl.mdl.ri_update(model) == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.mdl.ri_bind_stream(0, stream, 0) == codes.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_bind_stream(model, plain, 0) == codes.ACL_ERROR_RT_PARAM_INVALID
    fast, ret = acl.rt.create_stream_with_config(
        0, acl.ACL_STREAM_PERSISTENT | acl.ACL_STREAM_FAST_LAUNCH
    )
    assert acl.mdl.ri_bind_stream(model, fast, 0) == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.mdl.ri_bind_stream(model, 0xDEAD, 0) == codes.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.mdl.ri_bind_stream(model, stream, acl.ACL_MODEL_STREAM_FLAG_HEAD) == 0
    other, ret = acl.mdl.ri_build_begin(0)
    assert acl.mdl.ri_bind_stream(other, stream, 0) == codes.ACL_ERROR_RT_STREAM_MODEL
    assert acl.mdl.ri_unbind_stream(other, stream) == codes.ACL_ERROR_RT_STREAM_MODEL
    assert acl.mdl.ri_end_task(other, stream) == codes.ACL_ERROR_RT_STREAM_MODEL
    assert acl.rt.active_stream(stream, plain) == codes.ACL_ERROR_RT_STREAM_MODEL
    assert acl.rt.active_stream(0, stream) == codes.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.ri_build_end(model, 1) == codes.ACL_ERROR_INVALID_PARAM
    # a pageable copy cannot be recorded; a synchronize of a bound stream returns at once
    data = bytes(8)
    dst = word(acl, 0)
    assert (
        acl.rt.memcpy_async(dst, 8, acl.util.bytes_to_ptr(data), 8, 1, stream)
        == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    )
    assert acl.rt.synchronize_stream(stream) == 0
    # a captured model has no bound streams
    capture, ret = acl.rt.create_stream()
    assert acl.mdl.ri_capture_begin(capture, acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED) == 0
    assert acl.mdl.ri_bind_stream(model, capture, 0) in (
        codes.ACL_ERROR_RT_PARAM_INVALID,
        codes.ACL_ERROR_RT_STREAM_CAPTURED,
    )
    captured, ret = acl.mdl.ri_capture_end(capture)
    assert ret == 0
    assert acl.mdl.ri_bind_stream(captured, stream, 0) == codes.ACL_ERROR_RT_PARAM_INVALID
    for made in (model, other, captured):
        assert acl.mdl.ri_destroy(made) == 0
    for made in (plain, stream, fast, capture):
        assert acl.rt.destroy_stream(made) == 0
    assert acl.rt.free(dst) == 0


@pytest.mark.parametrize("left, cond, started", [(1, 0, True), (2, 0, False), (3, 2, True)])
def test_switch_stream_starts_its_stream_when_the_condition_holds(acl, left, cond, started):
    head, branch = persistent(acl), persistent(acl)
    flag = word(acl, 0, 8)
    left_addr, right_addr = word(acl, left), word(acl, 1)
    model, ret = acl.mdl.ri_build_begin(0)
    assert acl.mdl.ri_bind_stream(model, head, acl.ACL_MODEL_STREAM_FLAG_HEAD) == 0
    assert acl.mdl.ri_bind_stream(model, branch, acl.ACL_MODEL_STREAM_FLAG_DEFAULT) == 0
    assert acl.rt.switch_stream(left_addr, 9, right_addr, 0, branch, 0, head) == (
        codes.ACL_ERROR_RT_PARAM_INVALID
    )
    assert acl.rt.switch_stream(left_addr, cond, right_addr, 0, branch, head, head) == (
        codes.ACL_ERROR_INVALID_PARAM
    )
    assert acl.rt.switch_stream(left_addr, cond, right_addr, 0, branch, 0, head) == 0
    assert acl.rt.value_write(flag, 7, 0, branch) == 0
    assert acl.mdl.ri_end_task(model, head) == 0
    assert acl.mdl.ri_build_end(model, None) == 0
    assert read(acl, flag) == 0  # recorded, not run
    run, ret = acl.rt.create_stream()
    assert acl.mdl.ri_execute_async(model, run) == 0
    assert acl.rt.synchronize_stream(run) == 0
    assert read(acl, flag) == (7 if started else 0)
    assert acl.mdl.ri_destroy(model) == 0
    for stream in (head, branch, run):
        assert acl.rt.destroy_stream(stream) == 0
    for addr in (flag, left_addr, right_addr):
        assert acl.rt.free(addr) == 0


@pytest.mark.parametrize("index, written", [(0, (0, 2)), (1, (0, 0)), (5, (0, 0))])
def test_switch_label_drops_the_tasks_before_its_label(acl, index, written):
    stream = persistent(acl)
    first, second = word(acl, 0, 8), word(acl, 0, 8)
    index_addr = word(acl, index)
    model, ret = acl.mdl.ri_build_begin(0)
    assert acl.mdl.ri_bind_stream(model, stream, acl.ACL_MODEL_STREAM_FLAG_HEAD) == 0
    labels = [acl.rt.create_label()[0] for _ in range(2)]
    label_list, ret = acl.rt.create_label_list(labels, 2)
    assert ret == 0
    assert acl.rt.create_label_list(labels, 3)[1] == codes.ACL_ERROR_INVALID_PARAM
    assert acl.rt.switch_label_by_index(index_addr, 0, label_list, stream) == (
        codes.ACL_ERROR_RT_PARAM_INVALID
    )
    assert acl.rt.switch_label_by_index(index_addr, 2, label_list, stream) == 0
    assert acl.rt.value_write(first, 1, 0, stream) == 0
    assert acl.rt.set_label(labels[0], stream) == 0
    assert acl.rt.set_label(labels[0], stream) == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.value_write(second, 2, 0, stream) == 0
    assert acl.rt.set_label(labels[1], stream) == 0
    assert acl.mdl.ri_end_task(model, stream) == 0
    assert acl.mdl.ri_build_end(model, None) == 0
    run, ret = acl.rt.create_stream()
    assert acl.mdl.ri_execute_async(model, run) == 0
    assert acl.rt.synchronize_stream(run) == 0
    assert (read(acl, first), read(acl, second)) == written
    assert acl.mdl.ri_unbind_stream(model, stream) == 0
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.destroy_label_list(label_list) == 0
    assert acl.rt.destroy_label_list(label_list) == codes.ACL_ERROR_RT_INVALID_HANDLE
    for label in labels:
        assert acl.rt.destroy_label(label) == 0
    assert acl.rt.destroy_label(0) == codes.ACL_ERROR_INVALID_PARAM
    for made in (stream, run):
        assert acl.rt.destroy_stream(made) == 0
    for addr in (first, second, index_addr):
        assert acl.rt.free(addr) == 0


def test_a_backward_jump_is_not_supported(acl):
    stream = persistent(acl)
    index_addr = word(acl, 0)
    model, ret = acl.mdl.ri_build_begin(0)
    assert acl.mdl.ri_bind_stream(model, stream, 0) == 0
    label, ret = acl.rt.create_label()
    label_list, ret = acl.rt.create_label_list([label], 1)
    assert acl.rt.set_label(label, stream) == 0
    assert acl.rt.switch_label_by_index(index_addr, 1, label_list, stream) == 0
    assert acl.mdl.ri_build_end(model, None) == codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.mdl.ri_destroy(model) == 0  # unbinds its streams
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_label_list(label_list) == 0
    assert acl.rt.destroy_label(label) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(index_addr) == 0
