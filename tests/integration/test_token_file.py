"""The TCP token from files, as containers use it: SIMNPU_TOKEN_FILE on both sides (a compose
secret), --create-token (a random token on first start), and `simnpu health`."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

from conftest import run_client

CLIENT = """
import simnpu.client as npu
npu.Device(0)
print("uses_shared_memory", npu.runtime().memory.uses_shared_memory)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def health(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simnpu", "health", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_a_created_token_file_lets_clients_in_and_survives_a_restart(start_daemon, tmp_path):
    token_file = tmp_path / "token"
    address = f"127.0.0.1:{free_port()}"
    env = {"SIMNPU_TOKEN_FILE": str(token_file), "SIMNPU_CREATE_TOKEN": "1", "SIMNPU_TOKEN": ""}
    daemon = start_daemon("--listen", address, env=env, address=address)
    token = token_file.read_text().strip()
    assert len(token) >= 32 and stat.S_IMODE(token_file.stat().st_mode) == 0o600

    allowed = run_client(
        address, CLIENT, env={"SIMNPU_TOKEN_FILE": str(token_file), "SIMNPU_TOKEN": ""}
    )
    assert "uses_shared_memory True" in allowed.stdout, allowed.stderr
    refused = run_client(address, CLIENT, env={"SIMNPU_TOKEN": "wrong"})
    assert refused.returncode != 0 and "207006" in refused.stderr
    missing = run_client(
        address, CLIENT, env={"SIMNPU_TOKEN": "", "SIMNPU_TOKEN_FILE": str(tmp_path / "nope")}
    )
    assert missing.returncode != 0 and "SIMNPU_TOKEN_FILE" in missing.stderr

    assert daemon.stop() == 0
    start_daemon("--listen", address, env=env, address=address)
    assert token_file.read_text().strip() == token  # an existing file is kept


def test_without_a_token_a_tcp_listener_is_refused_at_start(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "simnpu.server", "--listen", f"127.0.0.1:{free_port()}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SIMNPU_TOKEN": "", "SIMNPU_TOKEN_FILE": "", "SIMNPU_CREATE_TOKEN": "1"},
    )
    assert result.returncode == 2 and "needs a shared token" in result.stderr


def test_simnpu_health_answers_serving_or_exits_1(daemon, tmp_path):
    serving = health("--address", daemon.address)
    assert serving.returncode == 0 and serving.stdout.strip().endswith("SERVING"), serving.stderr
    nobody = health("--address", f"unix://{tmp_path}/none.sock", "--timeout", "1")
    assert nobody.returncode == 1 and "UNREACHABLE" in nobody.stdout
    quiet = health("--quiet", env={"SIMNPU_ADDRESS": daemon.address})
    assert quiet.returncode == 0 and quiet.stdout == ""
