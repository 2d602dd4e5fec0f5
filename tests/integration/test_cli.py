"""The `simnpu` command itself: --version, serve --help, and what the tools say when
there is no daemon, the daemon does not answer, or a file is not a trace."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from importlib.metadata import version

import pytest


def simnpu(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simnpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_version_comes_from_the_package_metadata():
    result = simnpu("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"simnpu {version('simnpu')}\n"


def test_serve_help_explains_every_flag_and_its_default():
    result = simnpu("serve", "--help")
    assert result.returncode == 0, result.stderr
    options = result.stdout.split("options:\n", 1)[1]
    blocks = re.split(r"\n(?=  -)", options.strip("\n"))
    flags = [block.split()[0] for block in blocks]
    assert "--listen" in flags and "--idle-exit" in flags and "--log-level" in flags
    for block in blocks[1:]:  # after -h, --help
        text = " ".join(block.split())
        assert re.search(r"^--[a-z-]+( [A-Z]+)? \w.* \(default: [^)]+\)$", text), text
    assert "(default: 2GiB, $SIMNPU_MEMORY)" in " ".join(options.split())


def test_serve_names_a_listen_address_it_cannot_use(tmp_path):
    result = simnpu("serve", "--listen", f"{tmp_path}/npu.sock")
    assert result.returncode == 2
    assert f"needs the prefix unix: (unix://{tmp_path}/npu.sock)" in result.stderr, result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("view", [("memory", "stats"), ("smi",), ("check", "report")])
def test_a_tool_without_a_daemon_says_how_to_keep_one_and_starts_none(tmp_path, view):
    named = simnpu(*view, "--address", f"unix://{tmp_path}/npu.sock")
    assert named.returncode == 1 and named.stdout == ""
    [line] = named.stderr.splitlines()
    assert f"no simnpu daemon at unix://{tmp_path}/npu.sock" in line
    assert f"`simnpu serve --listen unix://{tmp_path}/npu.sock` in another terminal" in line
    assert "SIMNPU_IDLE_EXIT" in line
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    default = simnpu(
        *view, env={"SIMNPU_ADDRESS": "", "XDG_RUNTIME_DIR": str(run_dir), "SIMNPU_AUTOSTART": ""}
    )
    assert default.returncode == 1
    assert "run `simnpu serve` in another terminal" in default.stderr, default.stderr
    assert os.listdir(run_dir) == []  # where a client would have started one: nothing


def test_health_says_in_one_line_that_nothing_listens(tmp_path):
    result = simnpu("health", "--address", f"unix://{tmp_path}/npu.sock", "--timeout", "5")
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert line.startswith(f"unix://{tmp_path}/npu.sock: UNREACHABLE: no simnpu daemon at ")
    assert line.endswith(f"(no socket file {tmp_path}/npu.sock)")
    assert "simnpu serve --listen" in line and "failed to connect" not in line
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        refused = simnpu("health", "--address", f"127.0.0.1:{port}", "--timeout", "5")
    assert refused.returncode == 1
    assert refused.stdout.strip().endswith("(connection refused)"), refused.stdout


def test_health_says_when_a_listener_never_answers():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        result = simnpu("health", "--address", f"127.0.0.1:{port}", "--timeout", "1")
    assert result.returncode == 1
    assert result.stdout == (
        f"127.0.0.1:{port}: UNREACHABLE: the simnpu daemon at 127.0.0.1:{port} "
        "did not answer within 1 s\n"
    )


@pytest.mark.parametrize(
    "document, why",
    [
        ({}, 'no "traceEvents" list'),
        ([], 'no "traceEvents" list'),
        ({"traceEvents": {}}, 'no "traceEvents" list'),
        ({"traceEvents": [7]}, "traceEvents[0] is not an event object"),
        ({"traceEvents": [{"ph": "X", "name": "k"}]}, "traceEvents[0] is a slice without"),
    ],
)
def test_trace_summary_refuses_a_file_that_is_not_a_trace(tmp_path, document, why):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document))
    result = simnpu("trace", "summary", str(path))
    assert result.returncode == 1 and result.stdout == ""
    assert f"{path} is not a trace simnpu can summarize: " in result.stderr
    assert why in result.stderr and "SIMNPU_TRACE" in result.stderr


def test_trace_summary_reads_an_empty_trace(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [], "otherData": {"generator": "simnpu"}}))
    result = simnpu("trace", "summary", str(path))
    assert result.returncode == 0, result.stderr
    assert "0 tasks on 0 stream(s)" in result.stdout
