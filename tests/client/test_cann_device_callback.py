"""The programs after the CANN runtime's device and callback examples
(examples/cann/1_basic_features/device/, examples/cann/2_advanced_features/callback/),
each run as a user runs it against a real daemon, checked on what it prints."""

from __future__ import annotations

import re

import pytest
from cann_examples import run_cann_example
from conftest import DaemonProcess


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """A daemon with two devices, for the peer-copy example (and the rest alike)."""
    process = DaemonProcess(tmp_path_factory.mktemp("cann"), "--devices", "2", "--memory", "64MiB")
    yield process
    assert process.stop() == 0, process.output()


def info_lines(output: str, start: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"[INFO]  {start}")]


def test_device_normal(two_devices):
    out = run_cann_example(two_devices.address, "1_basic_features/device/0_device_normal.py")
    sums = ["1.200000", "2.200000", "3.200000", "5.400000"]
    sums += ["6.400000", "7.400000", "9.600000", "10.600000"]
    assert info_lines(out, "result[") == [
        f"[INFO]  result[{index}] is: {value}" for index, value in enumerate(sums)
    ]
    assert "done." in out.splitlines()[-1]


def test_device_multi_thread(two_devices):
    out = run_cann_example(two_devices.address, "1_basic_features/device/1_device_multi_thread.py")
    assert "[INFO]  SoC name: simnpu-simulated-npu." in out
    assert "[INFO]  Device count: 2." in out
    assert "[INFO]  Device status: 0." in out
    assert "[INFO]  Run mode: ACL_HOST." in out
    assert "[INFO]  Stream priorities: least 7, greatest 0." in out
    assert "[INFO]  Vector cores: 2." in out
    assert "[INFO]  Vector core limit of this process: 1." in out
    assert info_lines(out, "hostDst[") == [
        f"[INFO]  hostDst[{i}] = {2 * i:f}, expected {2 * i:f}" for i in range(10)
    ]
    assert "the thread's sums are right" in out


def test_device_p2p(two_devices, daemon):
    out = run_cann_example(two_devices.address, "1_basic_features/device/2_device_P2P.py")
    assert out.splitlines() == [
        "[INFO]  device_P2P: starting.",
        "[INFO]  Copied device 0's bytes into device 1.",
        "[INFO]  Copied device 1's bytes to the host.",
        "[INFO]  The first byte read back is 103: as written on device 0.",
        "[INFO]  device_P2P: done.",
    ]
    # With one device the example says it cannot run, and succeeds.
    out = run_cann_example(daemon.address, "1_basic_features/device/2_device_P2P.py")
    assert "[SKIP] peer copies need two devices; this daemon has 1." in out


def test_simple_callback(two_devices):
    out = run_cann_example(two_devices.address, "2_advanced_features/callback/0_simple_callback.py")
    report = re.search(r"Report thread: (\d+)\.", out)
    host_func = re.search(r"Host-function thread: (\d+)\.", out)
    assert report and host_func, out
    on_threads = re.findall(r"(Callback|Host function) on thread (\d+)\.", out)
    assert on_threads == [
        ("Callback", report[1]),
        ("Host function", host_func[1]),
        *[("Callback", report[1])] * 5,
    ]
    seen = [line for line in out.splitlines() if "sees user data" in line]
    assert [line.split("sees user data ")[1] for line in seen] == ["520."] * 7
    assert "before the kernel" in seen[0] and "host function" in seen[1]
    assert "[INFO]  After the stream's tasks the counter is: 1." in out
    assert "[INFO]  The report thread exits." in out
    assert "[INFO]  The host-function thread exits." in out
    assert "every callback ran in order" in out.splitlines()[-1]


def test_callback_hostfunc(two_devices):
    out = run_cann_example(
        two_devices.address, "2_advanced_features/callback/1_callback_hostfunc.py"
    )
    assert out.splitlines() == [
        "[INFO]  The host function runs.",
        "[INFO]  After the stream's tasks the counter is: 1.",
        "[INFO]  Resources released.",
    ]


def test_callback_exception(two_devices):
    out = run_cann_example(
        two_devices.address, "2_advanced_features/callback/2_callback_exception.py"
    )
    last = re.search(r"This thread's last task id: (\d+)\.", out)
    assert last, out
    assert f"[INFO]  The failed task's task id: {last[1]}." in out
    assert "[INFO]  The failed task's device id: 0." in out
    assert "[INFO]  The failed task's error code: 507015." in out
    assert "[INFO]  Arguments query: ret=207000, dev_args_ptr=0x0, len=0." in out
    assert "[INFO]  Function query: ret=0," in out
    lines = out.splitlines()
    failed = lines.index("[ERROR]  acl.rt.synchronize_stream returned error code 507015")
    assert lines.index("[INFO]  An exception occurred: the exception callback runs.") < failed
    assert "[INFO]  Verbose error info: error_type=3, try_repair=0, has_detail=1." in out
    assert "[ERROR]  Diagnostics: peeked 507015, last 507015, recent message: " in out
    assert "ACL_ERROR_RT_AICORE_EXCEPTION (507015): kernel error_op raised" in out
    assert "[INFO]  After the tasks the counter is: 1." in out
    assert "A callback after the failure ran" not in out
    assert "[INFO]  The report thread exits." in out
    assert "the failure was reported as expected" in lines[-1]
