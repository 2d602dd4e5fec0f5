"""The folder of the daemon's Unix socket is checked by both sides: a per-user default
folder other users can write (or own), a folder every user can write without the sticky
bit, and symbolic links planted where the lock and log files go are refused; the
autostarted daemon's log is rotated."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import alive, children_of, run_client, simnpu_segments

from simnpu.proto import codes

# Connects like any program; prints the error code and message it gets.
CONNECT = """
from simnpu.client.runtime import Runtime
from simnpu.proto.errors import NpuError
try:
    Runtime().close()
    print("connected")
except NpuError as error:
    print(error.code)
    print(error.message)
"""

# Starts a daemon by itself and prints its pid.
STARTED_PID = """
from simnpu.client.runtime import Runtime
from simnpu.client.tools.query import query
runtime = Runtime()
print(query("devices")["pid"])
runtime.close()
"""


def folder(path, mode: int):
    path.mkdir()
    os.chmod(path, mode)
    return path


def impostor(path) -> socket.socket:
    """Another user's listener where the daemon's socket belongs."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    return listener


def refused(result: subprocess.CompletedProcess) -> str:
    """The message of a client that was refused with ACL_ERROR_RT_NO_DEVICE."""
    lines = result.stdout.splitlines()
    assert lines and lines[0] == str(codes.ACL_ERROR_RT_NO_DEVICE), result.stdout + result.stderr
    return "\n".join(lines[1:])


def serve(*arguments: str, env=None) -> subprocess.CompletedProcess:
    """`simnpu serve` that must refuse to start (killed if it starts after all)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "simnpu.server", "--memory", "64MiB", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        workers = children_of(process.pid)
        process.terminate()
        process.communicate(timeout=30)
        for pid in workers:
            if alive(pid):
                os.kill(pid, 9)
        raise AssertionError("the daemon started in an unsafe folder") from None
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_client_refuses_a_default_folder_other_users_can_write(tmp_path, mode):
    run = folder(tmp_path / "run", mode)
    listener = impostor(run / "simnpu.sock")
    try:
        result = run_client(
            f"unix://{run}/simnpu.sock", CONNECT, timeout=60, env={"XDG_RUNTIME_DIR": str(run)}
        )
    finally:
        listener.close()
    message = refused(result)
    assert str(run) in message and f"mode {mode:04o}" in message
    assert "writable by other users" in message and "rm -r" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_client_refuses_a_default_folder_another_user_owns(tmp_path):
    run = folder(tmp_path / "run", 0o700)
    listener = impostor(run / "simnpu.sock")
    os.chown(run, 12345, 12345)
    try:
        result = run_client(
            f"unix://{run}/simnpu.sock", CONNECT, timeout=60, env={"XDG_RUNTIME_DIR": str(run)}
        )
    finally:
        listener.close()
    message = refused(result)
    assert str(run) in message and "not owned by this user" in message
    assert "owner uid 12345" in message


def test_the_daemon_refuses_a_folder_every_user_can_write(tmp_path):
    shared = folder(tmp_path / "shared", 0o777)
    result = serve("--listen", f"unix://{shared}/npu.sock")
    assert result.returncode == 2
    assert str(shared) in result.stderr and "mode 0777" in result.stderr
    assert "sticky" in result.stderr
    assert not os.path.exists(shared / "npu.sock")


def test_the_daemon_refuses_a_default_folder_its_group_can_write(tmp_path):
    run = folder(tmp_path / "run", 0o770)
    result = serve(env={"XDG_RUNTIME_DIR": str(run), "SIMNPU_ADDRESS": "", "SIMNPU_LISTEN": ""})
    assert result.returncode == 2
    assert str(run) in result.stderr and "writable by other users" in result.stderr
    assert not os.path.exists(run / "simnpu.sock")


@pytest.mark.parametrize("planted", ["simnpu.lock", "simnpu-daemon.log"])
def test_links_planted_in_a_sticky_folder_are_not_followed(tmp_path, planted):
    shared = folder(tmp_path / "shared", 0o1777)  # like /tmp: allowed, but anyone may plant
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, shared / planted)
    result = run_client(
        f"unix://{shared}/npu.sock",
        CONNECT,
        timeout=120,
        env={"SIMNPU_AUTOSTART": "1", "SIMNPU_IDLE_EXIT": "1", "SIMNPU_MEMORY": "64MiB"},
    )
    message = refused(result)
    assert str(shared / planted) in message and "symbolic link" in message
    assert victim.read_text() == "precious"
    assert not os.path.exists(shared / "npu.sock")


def test_the_autostarted_daemons_log_is_rotated(tmp_path):
    run = folder(tmp_path / "run", 0o700)
    log = run / "simnpu-daemon.log"
    log.write_bytes(b"old\n" * ((10 << 20) // 4 + 1))  # just over 10 MiB
    result = run_client(
        f"unix://{run}/npu.sock",
        STARTED_PID,
        timeout=120,
        env={
            "SIMNPU_AUTOSTART": "1",
            "SIMNPU_IDLE_EXIT": "1",
            "SIMNPU_MEMORY": "64MiB",
            "SIMNPU_LOG_LEVEL": "INFO",
        },
    )
    daemon_pid = int(result.stdout.split()[0])
    deadline = time.monotonic() + 30
    while alive(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(daemon_pid), "the autostarted daemon did not exit"
    assert not [n for n in simnpu_segments() if n.startswith(f"simnpu-{daemon_pid}-")]
    assert (run / "simnpu-daemon.log.1").stat().st_size == (10 << 20) + 4
    assert 0 < log.stat().st_size < 1 << 20
    assert f"simnpu daemon {daemon_pid} serving" in log.read_text()
