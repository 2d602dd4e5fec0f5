"""Where clients look for the daemon and when they start one: SIMNPU_ADDRESS checked once,
autostart only at the default address (or with SIMNPU_AUTOSTART=1), and a daemon and
workers that never import from the working directory of whoever started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import alive, children_of, simnpu_segments

from simnpu.client import autostart
from simnpu.client.runtime import Runtime
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

# Adds with a built-in kernel, then prints the pid of the daemon it used.
PROGRAM = """
import numpy as np
import simnpu.client as npu
from simnpu.client.tools.query import query

n = 4096
a = np.arange(n, dtype=np.float32)
with npu.Device(0) as device:
    x, y = npu.DeviceBuffer.from_array(a), npu.DeviceBuffer.from_array(a)
    out = npu.DeviceBuffer(a.nbytes)
    npu.builtin("add_f32").launch(2, x, y, out, n)
    device.synchronize()
    assert np.array_equal(out.to_numpy(np.float32), a + a)
    for buffer in (x, y, out):
        buffer.free()
print(query("devices")["pid"])
"""

RAISING = "raise ImportError('imported from the working directory')\n"


def shadowing_folder(path, *packages: str):
    """A folder holding packages that must never be imported from it."""
    path.mkdir()
    for name in packages:
        (path / name).mkdir()
        (path / name / "__init__.py").write_text(RAISING)
    return path


def run_program(tmp_path, cwd, env: dict) -> subprocess.CompletedProcess:
    """PROGRAM as a script outside `cwd`, run in `cwd` (so only the daemon could import it)."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SIMNPU_IDLE_EXIT": "1", "SIMNPU_MEMORY": "64MiB", **env},
    )


def gone_by_itself(daemon_pid: int, socket_path) -> None:
    """The autostarted daemon exits after its last client, leaving nothing behind (killed,
    with its workers, if it does not)."""
    workers = children_of(daemon_pid)
    deadline = time.monotonic() + 30
    while (alive(daemon_pid) or any(map(alive, workers))) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in [daemon_pid, *workers] if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the autostarted daemon or its workers did not exit"
    assert not [n for n in simnpu_segments() if n.startswith(f"simnpu-{daemon_pid}-")]
    assert not os.path.exists(socket_path)


@pytest.mark.slow
def test_an_autostarted_daemon_runs_kernels_when_started_beside_a_simnpu_folder(tmp_path):
    work = shadowing_folder(tmp_path / "work", "simnpu")
    run = tmp_path / "run"
    run.mkdir()
    address = f"unix://{run}/npu.sock"
    result = run_program(tmp_path, work, {"SIMNPU_ADDRESS": address, "SIMNPU_AUTOSTART": "1"})
    assert result.returncode == 0, result.stderr + (run / "simnpu-daemon.log").read_text()
    gone_by_itself(int(result.stdout), run / "npu.sock")


@pytest.mark.slow
def test_a_relative_unix_address_autostarts_a_daemon_there(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = {"SIMNPU_ADDRESS": "unix:npu.sock", "SIMNPU_AUTOSTART": "1"}
    result = run_program(tmp_path, work, env)
    assert result.returncode == 0, result.stderr
    assert (work / "simnpu-daemon.log").exists()
    gone_by_itself(int(result.stdout), work / "npu.sock")


@pytest.mark.slow
def test_simnpu_serve_workers_never_import_from_its_working_directory(tmp_path):
    """`simnpu serve` itself does not look in its working directory; its workers, spawned by
    multiprocessing, did (a `multiprocessing` folder there broke every worker)."""
    work = shadowing_folder(tmp_path / "work", "simnpu", "multiprocessing")
    address = f"unix://{tmp_path}/npu.sock"
    simnpu = os.path.join(os.path.dirname(sys.executable), "simnpu")
    log = open(tmp_path / "daemon.log", "wb")
    daemon = subprocess.Popen(
        [simnpu, "serve", "--listen", address, "--memory", "64MiB", "--log-level", "WARNING"],
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not autostart.reachable(address):
            assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
            assert time.monotonic() < deadline, "the daemon did not come up"
            time.sleep(0.02)
        workers = children_of(daemon.pid)
        result = run_program(tmp_path, tmp_path, {"SIMNPU_ADDRESS": address})
        assert result.returncode == 0, result.stderr
        assert int(result.stdout) == daemon.pid
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
        log.close()
    deadline = time.monotonic() + 10
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)]
    assert not [n for n in simnpu_segments() if n.startswith(f"simnpu-{daemon.pid}-")]


@pytest.mark.parametrize(
    "value, why",
    [
        ("/tmp/x.sock", "needs the prefix unix: (unix:///tmp/x.sock)"),
        ("run/x.sock", "needs the prefix unix: (unix:run/x.sock)"),
        ("unix://x.sock", "absolute path"),
        ("unix:", "empty"),
        ("localhost", "no port"),
        ("localhost:http", "'http' is not a number"),
        ("::1:50151", "in brackets"),
    ],
)
def test_a_malformed_simnpu_address_is_207004_naming_the_variable(monkeypatch, value, why):
    monkeypatch.setenv("SIMNPU_ADDRESS", value)
    monkeypatch.setenv("SIMNPU_AUTOSTART", "1")
    with pytest.raises(NpuError) as caught:
        Runtime()
    assert caught.value.code == codes.ACL_ERROR_RT_NO_DEVICE
    message = caught.value.message
    assert f"SIMNPU_ADDRESS={value!r}" in message and why in message, message
    assert "unix:///abs/path.sock" in message and "[v6]:port" in message


def test_a_malformed_address_given_to_connect_is_207004(tmp_path):
    with pytest.raises(NpuError) as caught:
        Runtime(str(tmp_path / "x.sock"))
    assert caught.value.code == codes.ACL_ERROR_RT_NO_DEVICE
    assert f"unix://{tmp_path}/x.sock" in caught.value.message


def test_a_named_address_starts_no_daemon_unless_autostart_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMNPU_AUTOSTART")
    monkeypatch.setenv("SIMNPU_ADDRESS", f"unix://{tmp_path}/npu.sock")
    with pytest.raises(NpuError) as caught:
        Runtime()
    assert caught.value.code == codes.ACL_ERROR_RT_NO_DEVICE
    message = caught.value.message
    assert f"simnpu serve --listen unix://{tmp_path}/npu.sock" in message, message
    assert "SIMNPU_AUTOSTART=1" in message
    assert os.listdir(tmp_path) == []  # no lock, no log, no daemon


def test_autostart_never_creates_the_folder_of_a_named_address(tmp_path, monkeypatch):
    missing = tmp_path / "not" / "there"
    monkeypatch.setenv("SIMNPU_AUTOSTART", "1")
    monkeypatch.setenv("SIMNPU_ADDRESS", f"unix://{missing}/npu.sock")
    with pytest.raises(NpuError) as caught:
        Runtime()
    assert caught.value.code == codes.ACL_ERROR_RT_NO_DEVICE
    assert f"its folder {missing} does not exist" in caught.value.message
    assert os.listdir(tmp_path) == []


def test_a_misspelt_autostart_setting_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMNPU_AUTOSTART", "yes")
    monkeypatch.setenv("SIMNPU_ADDRESS", f"unix://{tmp_path}/npu.sock")
    with pytest.raises(NpuError) as caught:
        Runtime()
    assert "SIMNPU_AUTOSTART='yes'" in caught.value.message
    assert os.listdir(tmp_path) == []


def test_tools_validate_the_address_too(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "simnpu", "smi"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SIMNPU_ADDRESS": str(tmp_path / "x.sock")},
    )
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert "SIMNPU_ADDRESS=" in line and f"unix://{tmp_path}/x.sock" in line, result.stderr
