"""acl.init / acl.finalize and the session they own, each in its own process (as a pyACL
program is): repeat codes, lazy connection, config files, autostart, cleanup."""

from __future__ import annotations

import os
import time

import pytest
from conftest import alive, run_client, simnpu_segments

from simnpu.client import autostart


def lines(result):
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")


def test_init_and_finalize_codes(daemon):
    out = lines(
        run_client(
            daemon.address,
            """
        import acl
        print(acl.get_recent_err_msg())
        print(acl.init(), acl.init())
        print(acl.get_recent_err_msg())
        print(acl.rt.set_device(0), acl.finalize(), acl.finalize())
        print(acl.rt.set_device(0), acl.rt.get_device_count())
        print(acl.get_recent_err_msg())
        print(acl.init(), acl.rt.set_device(0), acl.rt.reset_device(0), acl.finalize())
    """,
        )
    )
    assert out[0] == "None"
    assert out[1] == "0 100002"
    assert out[2].startswith("acl.init: ACL_ERROR_REPEAT_INITIALIZE (100002)")
    assert out[3] == "0 0 100037"
    assert out[4] == "100001 (0, 100001)"  # after finalize: no silent reconnection
    assert "acl.finalize() ended this process's session" in out[5]
    assert out[6] == "0 0 0 0"  # init again starts a new session


def test_calls_before_init_connect_lazily(daemon):
    out = lines(
        run_client(
            daemon.address,
            """
        import acl
        print(acl.rt.set_device(0))
        ptr, ret = acl.rt.malloc(1024, 0)
        print(ret, acl.init(), acl.rt.free(ptr), acl.rt.reset_device(0), acl.finalize())
    """,
        )
    )
    assert out[:2] == ["0", "0 0 0 0 0"]  # init keeps the session the first call opened


def test_config_file_is_checked(daemon, tmp_path):
    (tmp_path / "acl.json").write_text('{"dump": {"dump_path": "/tmp"}}')
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text("")
    out = lines(
        run_client(
            daemon.address,
            f"""
        import acl
        print(acl.init({str(tmp_path / "absent.json")!r}), acl.init({str(tmp_path / "bad.json")!r}))
        print(acl.init({str(tmp_path / "acl.json")!r}), acl.finalize())
        print(acl.init({str(tmp_path / "empty.json")!r}), acl.finalize(),
              acl.init(""), acl.finalize())
        try:
            acl.init(5)
        except TypeError as error:
            print("TypeError")
    """,
        )
    )
    assert out[:4] == ["100003 100006", "0 0", "0 0 0 0", "TypeError"]


def test_finalize_and_exit_free_the_session(daemon):
    used = """
        import acl
        print(acl.init(), acl.rt.set_device(0), acl.rt.malloc(64 << 20, 0)[1],
              acl.rt.malloc_host(1 << 20)[1])
        {end}
    """
    assert lines(run_client(daemon.address, used.format(end="print(acl.finalize())")))[:2] == [
        "0 0 0 0",
        "0",
    ]
    assert (
        lines(run_client(daemon.address, used.format(end="import os; os._exit(0)")))[0] == "0 0 0 0"
    )
    probe = """
        import acl, time
        acl.init(); acl.rt.set_device(0)
        for _ in range(100):
            free, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
            if free == total:
                break
            time.sleep(0.05)
        print(free == total, ret)
        acl.finalize()
    """
    assert lines(run_client(daemon.address, probe))[0] == "True 0"


@pytest.mark.slow
def test_two_devices(start_daemon):
    npu = start_daemon("--devices", "2")
    out = lines(
        run_client(
            npu.address,
            """
        import acl
        acl.init()
        print(acl.rt.get_device_count())
        print(acl.rt.set_device(1), acl.rt.get_device())
        ptr, ret = acl.rt.malloc(4096, 0)
        print(ret, ptr >> 40, acl.rt.free(ptr), acl.rt.set_device(2))
        acl.finalize()
    """,
        )
    )
    assert out[:3] == ["(2, 0)", "0 (1, 0)", "0 129 0 107001"]  # device 1 memory: 2**47 + 1 * 2**40


def test_no_daemon_and_no_autostart_is_207004(tmp_path):
    address = f"unix://{tmp_path}/nobody.sock"
    out = lines(
        run_client(
            address,
            """
        import acl
        print(acl.init())
        print(acl.get_recent_err_msg())
    """,
            env={"SIMNPU_AUTOSTART": "0"},
        )
    )
    assert out[0] == "207004" and "no simnpu daemon" in out[1]


@pytest.mark.slow
def test_init_starts_a_daemon_when_none_runs(tmp_path):
    """What a new user does: no daemon started by hand."""
    socket_path = tmp_path / "auto.sock"
    address = f"unix://{socket_path}"
    out = lines(
        run_client(
            address,
            """
        import acl
        print(acl.init(), acl.rt.set_device(0))
        ptr, ret = acl.rt.malloc(1024, 0)
        print(ret, acl.rt.free(ptr), acl.finalize())
    """,
            env={"SIMNPU_AUTOSTART": "1", "SIMNPU_IDLE_EXIT": "1"},
        )
    )
    assert out[:2] == ["0 0", "0 0 0"]
    daemons = [pid for pid in _pids() if str(socket_path) in _cmdline(pid)]
    assert len(daemons) == 1, daemons
    deadline = time.monotonic() + 30  # it exits by itself when idle
    while (alive(daemons[0]) or autostart.reachable(address)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(daemons[0]) and not autostart.reachable(address)
    assert not [name for name in simnpu_segments() if name.startswith(f"simnpu-{daemons[0]}-")]


def _pids():
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
