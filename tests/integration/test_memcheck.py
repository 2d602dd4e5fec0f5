"""Memory checking against a real daemon: out-of-bounds, use-after-free, cross-client access,
uninitialised reads and leaks, each planted beside the correct version of the same program
(which must report nothing). Errors reach the client as ACL does: 507053 at synchronize.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import run_client, start_client
from observe_helpers import found, kernels, next_line, sites

from simnpu.client import observe
from simnpu.proto import codes

N = 256
MEM_ERROR = codes.ACL_ERROR_RT_DEVICE_MEM_ERROR


@pytest.fixture
def checked(npu):
    observe.enable("memcheck,initcheck")
    with npu.Device(0):
        yield npu, kernels(npu)


def filled(npu, value: float = 1.0):
    return npu.DeviceBuffer.from_array(np.full(N, value, np.float32))


def errors() -> list[dict]:
    return [f for f in observe.report()["findings"] if f["severity"] == "error"]


# ---- out of bounds -------------------------------------------------------------------------------
def test_a_kernel_past_the_end_of_its_buffer_is_reported_with_kernel_block_and_sites(checked):
    npu, k = checked
    stream = npu.Stream()
    malloc_site = next_line()
    x = npu.DeviceBuffer.from_array(np.ones(N, np.float32))
    y = npu.DeviceBuffer(N * 4)
    launch_site = next_line()
    k["double"].launch(1, x, y, N + 10, stream=stream)  # 10 elements too many
    with pytest.raises(npu.NpuError) as failure:
        stream.synchronize()
    assert failure.value.code == MEM_ERROR
    assert "simnpu memcheck: out-of-bounds" in str(failure.value) and launch_site in str(
        failure.value
    )
    [error] = errors()
    assert error["kind"] == "out-of-bounds" and sites(error) == [launch_site]
    assert error["address"] == x.ptr and error["bytes"] == (N + 10) * 4
    assert "runs 40 bytes past the end of the 1024-byte allocation" in error["text"]
    assert (
        f"allocated at {malloc_site}" in error["text"] and "kernel double block 0" in error["text"]
    )
    x.free()
    y.free()


def test_the_same_kernel_within_bounds_reports_nothing(checked):
    npu, k = checked
    stream = npu.Stream()
    x, y = filled(npu), npu.DeviceBuffer(N * 4)
    k["double"].launch(2, x, y, N, stream=stream)
    stream.synchronize()
    assert y.to_numpy(np.float32)[-1] == 2.0
    x.free()
    y.free()
    assert observe.report(final=True)["findings"] == []


# ---- use after free ------------------------------------------------------------------------------
def test_a_kernel_given_a_freed_pointer_is_a_use_after_free(checked):
    npu, k = checked
    stream = npu.Stream()
    x = filled(npu)
    malloc_site = next_line()
    gone = npu.DeviceBuffer(N * 4)
    pointer = gone.ptr
    free_site = next_line()
    gone.free()
    k["double"].launch(1, x, pointer, N, stream=stream)
    with pytest.raises(npu.NpuError) as failure:
        stream.synchronize()
    assert failure.value.code == MEM_ERROR
    [error] = errors()
    assert error["kind"] == "use-after-free"
    assert (
        f"allocated at {malloc_site}" in error["text"] and f"freed at {free_site}" in error["text"]
    )
    x.free()


def test_freeing_memory_a_queued_kernel_still_uses_is_reported(checked):
    """aclrtFree does not wait for the device: the kernel still writes the freed block."""
    npu, k = checked
    stream = npu.Stream()
    block = npu.DeviceBuffer(N * 4)
    launch_site = next_line()
    k["slow_fill"].launch(1, block, N, 0.2, stream=stream)
    free_site = next_line()
    block.free()  # no synchronize first
    with pytest.raises(npu.NpuError) as failure:
        stream.synchronize()
    assert failure.value.code == MEM_ERROR and "use-after-free" in str(failure.value)
    [error] = errors()
    assert error["kind"] == "use-after-free" and error["free_site"] == free_site
    assert sites(error) == [launch_site] and "kernel slow_fill" in error["text"]


def test_a_copy_queued_before_a_free_and_run_after_it_is_a_use_after_free(checked):
    npu, _ = checked
    stream = npu.Stream()
    gate = threading.Event()
    source = filled(npu)
    block = npu.DeviceBuffer(N * 4)
    npu.runtime().callbacks.launch_host_func(
        stream.handle, lambda _: gate.wait(30), None
    )  # holds the stream
    copy_site = next_line()
    block.copy_from(source, stream=stream)
    free_site = next_line()
    block.free()
    gate.set()
    with pytest.raises(npu.NpuError) as failure:
        stream.synchronize()
    assert failure.value.code == MEM_ERROR and copy_site in str(failure.value)
    [error] = errors()
    assert error["kind"] == "use-after-free" and sites(error) == [copy_site]
    assert error["free_site"] == free_site and "write of bytes" in error["text"]
    source.free()


def test_freeing_after_synchronizing_reports_nothing(checked):
    npu, k = checked
    stream = npu.Stream()
    for _ in range(2):
        block = npu.DeviceBuffer(N * 4)
        k["slow_fill"].launch(1, block, N, 0.01, stream=stream)
        stream.synchronize()
        block.free()
    block = npu.DeviceBuffer(N * 4)
    other = npu.Stream()
    k["slow_fill"].launch(1, block, N, 0.01, stream=other)
    other.destroy()  # aclrtDestroyStream waits for the stream's tasks
    block.free()
    assert observe.report(final=True)["findings"] == []


# ---- another client's memory ---------------------------------------------------------------------
def test_a_kernel_touching_another_clients_memory_is_named_as_such(daemon):
    from simnpu.client.runtime import Runtime
    from simnpu.proto import commands
    from simnpu.proto import observe as bits

    owner, intruder = Runtime(daemon.address), Runtime(daemon.address)
    try:
        for rt in (owner, intruder):
            rt.contexts.set_device(0)
        intruder.observer.enable(bits.MEMCHECK)
        theirs = owner.memory.malloc(4096)
        mine = intruder.memory.malloc(4096)
        relu = intruder.kernels.get_function(commands.BUILTIN_BINARY, "relu_f32")
        args = intruder.kernels.signature(relu).pack(mine, theirs, 1024)
        intruder.kernels.launch_kernel(relu, 1, args, 0)
        with pytest.raises(Exception) as failure:
            intruder.sync.synchronize_stream(0)
        assert getattr(failure.value, "code", None) == MEM_ERROR
        [error] = found(intruder.observer.report(), "memcheck", "cross-client access")
        assert f"session {owner.session_id}" in error["text"]
        intruder.memory.free(mine)
        owner.memory.free(theirs)
    finally:
        owner.close()
        intruder.close()


# ---- IPC memory ----------------------------------------------------------------------------------
IMPORTER = """
import sys
import simnpu.client as npu
npu.connect()
with npu.Device(0):
    shared = npu.DeviceBuffer.ipc_import(sys.stdin.readline().strip())  # line 6
    print("imported", flush=True)
    if sys.stdin.readline().strip() == "close":
        shared.free()  # aclrtIpcMemClose
npu.shutdown()
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("closed", [True, False], ids=["importer-closes", "importer-never-closes"])
def test_memory_freed_while_another_process_imports_it(daemon, tmp_path, closed):
    """The exporter closes its key and frees while another process still holds an import:
    simnpu keeps the block for the importer, and the exporter's free counts (no leak of
    the exporter's). An import never closed is the importer's finding, naming the key, the
    exporter and the import's call site; closed, nobody has a finding."""
    from simnpu.client.runtime import Runtime
    from simnpu.proto import observe as bits

    report = tmp_path / "importer.txt"
    exporter = Runtime(daemon.address)
    importer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(IMPORTER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "SIMNPU_ADDRESS": daemon.address,
            "SIMNPU_CHECK": "memcheck",
            "SIMNPU_CHECK_REPORT": str(report),
        },
    )
    try:
        exporter.observer.enable(bits.MEMCHECK)
        exporter.contexts.set_device(0)
        block = exporter.memory.malloc(4096)
        exporter.memory.memset(block, 4096, 7, 4096)
        key = exporter.memory.ipc_mem_get_export_key(
            block, 4096, codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
        )
        importer.stdin.write(key + "\n")
        importer.stdin.flush()
        assert importer.stdout.readline().strip() == "imported", importer.stderr.read()
        exporter.memory.ipc_mem_close(key)
        exporter.memory.free(block)  # before the importer closed: ACL's order is the other one
        [held] = [b for b in exporter.memory.memory_snapshot(0) if b["address"] == block]
        assert held["ipc"]["held_after_free"]  # still allocated, for the importer
        assert exporter.observer.report(final=True)["findings"] == []  # freed: no leak
        importer.stdin.write("close\n" if closed else "keep\n")
        _, stderr = importer.communicate(timeout=120)
        assert importer.returncode == 0, stderr
        text = report.read_text()
        if closed:
            assert "nothing found" in text, text
            assert stderr.startswith("simnpu check: 0 error(s), 0 warning(s); report in")
        else:
            assert "WARNING memcheck: unclosed IPC import" in text, text
            assert key in text and f"exported by session {exporter.session_id} " in text
            assert f"{4096} bytes at {block:#x}" in text and "imported at <string>:6" in text
            assert stderr.startswith("simnpu check: 0 error(s), 1 warning(s); report in")
        assert exporter.observer.report(final=True)["findings"] == []
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.wait(10)
        exporter.close()


# ---- initcheck -----------------------------------------------------------------------------------
def test_copying_back_memory_nothing_wrote_is_an_uninitialised_read(checked):
    npu, _ = checked
    malloc_site = next_line()
    y = npu.DeviceBuffer(N * 4)
    y.fill(0, nbytes=N * 2)  # only the first half
    with pytest.raises(npu.NpuError) as failure:
        read_site = next_line()
        y.to_numpy(np.float32)
    assert failure.value.code == MEM_ERROR and "initcheck" in str(failure.value)
    [error] = errors()
    assert error["check"] == "initcheck" and sites(error) == [read_site]
    assert error["range"] == [y.ptr + N * 2, y.ptr + N * 4] and error["bytes"] == N * 2
    assert f"allocated at {malloc_site}" in error["text"]
    y.free()


def test_a_kernel_reading_memory_nothing_wrote_is_an_uninitialised_read(checked):
    npu, k = checked
    stream = npu.Stream()
    x, y = npu.DeviceBuffer(N * 4), npu.DeviceBuffer(N * 4)
    k["double"].launch(1, x, y, N, stream=stream)  # x was never written
    with pytest.raises(npu.NpuError):
        stream.synchronize()
    [error] = errors()
    assert error["check"] == "initcheck" and "kernel double" in error["text"]
    x.free()
    y.free()


def test_reads_of_written_memory_report_nothing(checked):
    npu, k = checked
    stream = npu.Stream()
    x = npu.DeviceBuffer(N * 4)
    x.copy_from_host(-np.ones(N, np.float32))
    y = npu.DeviceBuffer(N * 4)
    z = npu.DeviceBuffer(N * 4)
    z.fill(0, stream=stream)
    npu.builtin("relu_f32").launch(1, x, y, N, stream=stream)  # writes zeros through an "rw" view
    k["double"].launch(1, x, z, N, stream=stream)
    stream.synchronize()
    assert not y.to_numpy(np.float32).any()  # zeros, yet "written": no false report
    for buffer in (x, y, z):
        buffer.free()
    assert observe.report(final=True)["findings"] == []


# ---- leaks, through the environment variables ----------------------------------------------------
LEAKY = """
import simnpu.client as npu
npu.connect()
with npu.Device(0):
    kept = npu.DeviceBuffer(1000)   # line 5
    freed = npu.DeviceBuffer(2000)
    freed.free()
    {extra}
npu.shutdown()
"""


@pytest.mark.parametrize("leak", [True, False])
def test_leaks_at_the_end_of_a_session_go_to_the_report_file(daemon, tmp_path, leak):
    """A report path named in SIMNPU_CHECK_REPORT is written whatever was found."""
    report = tmp_path / "check.txt"
    code = LEAKY.format(extra="" if leak else "kept.free()")
    result = run_client(
        daemon.address, code, env={"SIMNPU_CHECK": "memcheck", "SIMNPU_CHECK_REPORT": str(report)}
    )
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert text.startswith("simnpu check report: client ") and "checks: memcheck" in text
    if leak:
        assert "WARNING memcheck: leak" in text and "1000 bytes at 0x" in text
        assert "allocated at <string>:5" in text and "2000 bytes" not in text
        assert result.stderr == f"simnpu check: 0 error(s), 1 warning(s); report in {report}\n"
    else:
        assert "nothing found" in text
        assert result.stderr == f"simnpu check: 0 error(s), 0 warning(s); report in {report}\n"


@pytest.mark.parametrize("leak", [True, False])
def test_without_a_report_path_a_file_is_written_only_for_findings(daemon, tmp_path, leak):
    """SIMNPU_CHECK alone: simnpu-check-<pid>.txt in the current folder only when something
    was found; the line on stderr either way."""
    code = f"import os\nos.chdir({str(tmp_path)!r})\n" + LEAKY.format(
        extra="" if leak else "kept.free()"
    )
    result = run_client(daemon.address, code, env={"SIMNPU_CHECK": "memcheck"})
    assert result.returncode == 0, result.stderr
    files = sorted(path.name for path in tmp_path.iterdir())
    if leak:
        assert len(files) == 1 and files[0].startswith("simnpu-check-"), files
        assert "WARNING memcheck: leak" in (tmp_path / files[0]).read_text()
        assert result.stderr == f"simnpu check: 0 error(s), 1 warning(s); report in {files[0]}\n"
    else:
        assert files == []
        assert result.stderr == "simnpu check: 0 error(s), 0 warning(s)\n"


def test_a_daemon_checking_everyone_reports_a_killed_clients_leak(start_daemon, tmp_path):
    report = tmp_path / "daemon-report.txt"
    process = start_daemon("--check", "memcheck", "--check-report", str(report))
    client = start_client(
        process.address,
        """
        import sys
        import simnpu.client as npu
        npu.connect()
        with npu.Device(0):
            kept = npu.DeviceBuffer(4096)
            print("ready", flush=True)
            sys.stdin.read()
    """,
    )
    try:
        assert client.stdout.readline().strip() == "ready"
    finally:
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)
    process.stop()
    text = report.read_text()
    assert "simnpu check report: simnpu daemon" in text and "WARNING memcheck: leak" in text
    assert "4096 bytes at 0x" in text and "allocated at <string>:6" in text
