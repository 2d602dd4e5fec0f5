"""The programs of examples/cann/ after the CANN runtime's IPC examples (events, notifies,
memory shared between processes), run against a real daemon."""

from __future__ import annotations

import pytest
from cann_examples import run_cann_example
from conftest import DaemonProcess


def test_ipcevent(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/ipcevent/0_ipcevent.py")
    assert "[INFO] producer: event status 1 (1 = complete)" in out
    assert "[INFO] producer: wrote the 64-byte IPC handle to a file" in out
    assert "[INFO] consumer: opened the producer's event" in out
    assert "[INFO] consumer: the event has come; the stream is synchronized" in out
    assert "[INFO] consumer: event status 1 (1 = complete)" in out
    assert "[INFO] producer: released everything" in out
    assert out.splitlines()[-1] == "[SUCCESS] the two processes synchronized through the IPC event"


def test_ipcevent_multi_device(daemon, start_daemon):
    program = "2_advanced_features/ipcevent/1_ipcevent_multi_device.py"
    skipped = run_cann_example(daemon.address, program)  # one device: the example skips
    assert "[SKIP] this needs at least 2 devices; only 1 available" in skipped
    assert "[SUCCESS]" not in skipped
    two = start_daemon("--devices", "2")
    out = run_cann_example(two.address, program)
    assert "[INFO] 2 device(s) available, 2 needed" in out
    assert "[INFO] consumer 1: opened the IPC event on device 1" in out
    assert "[INFO] consumer 1: event status 1 (1 = complete)" in out
    assert "[INFO] consumer 1 (device 1) finished successfully" in out
    assert "[INFO] producer: event status 1 (1 = complete)" in out
    assert "[INFO] producer: all 1 consumer(s) are done" in out
    assert out.splitlines()[-1] == (
        "[SUCCESS] the IPC event synchronized processes on several devices"
    )


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """A daemon of four small devices (the notify examples use devices 2 and 3)."""
    process = DaemonProcess(
        tmp_path_factory.mktemp("npu4"),
        "--devices",
        "4",
        "--memory",
        "64MiB",
        "--ai-cores",
        "1",
        "--copy-engines",
        "1",
    )
    yield process
    assert process.stop() == 0, process.output()


def test_ipc_notify_withpid(four_devices):
    out = run_cann_example(
        four_devices.address, "2_advanced_features/notify/0_ipc_notify_withpid.py"
    )
    assert "[INFO] A: device 2 may now reach device 3" in out
    assert "[INFO] B: device 3 may now reach device 2" in out
    assert "[INFO] A: process B may import the notify" in out
    assert "Source data: 123" in out.splitlines()
    assert "Destination data: 123" in out.splitlines()
    assert out.splitlines()[-1] == (
        "[SUCCESS] the notify synchronized the two processes: both sides saw 123"
    )


def test_ipc_notify_withoutpid(four_devices):
    out = run_cann_example(
        four_devices.address, "2_advanced_features/notify/1_ipc_notify_withoutpid.py"
    )
    assert "[INFO] A: device 2 may now reach device 3" in out
    assert "[INFO] B: got the notify's IPC key simnpu-notify-" in out
    assert "pid" not in out  # no whitelist
    assert "Source data: 123" in out.splitlines()
    assert "Destination data: 123" in out.splitlines()
    assert out.splitlines()[-1] == (
        "[SUCCESS] the notify synchronized the two processes: both sides saw 123"
    )


def test_ipc_memory_withpid(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/memory/10_ipc_memory_withpid.py")
    assert "[INFO] A: process B may import the memory" in out
    assert "[INFO] A: process B says it is done (1)" in out
    assert "Source data: 123" in out.splitlines()
    assert "Destination data: 123" in out.splitlines()
    assert out.splitlines()[-1] == "[SUCCESS] the memory was shared: both sides saw 123"


def test_ipc_memory_withoutpid(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/memory/11_ipc_memory_withoutpid.py")
    assert "pid" not in out  # no whitelist
    assert "[INFO] A: process B says it is done (1)" in out
    assert "Source data: 123" in out.splitlines()
    assert "Destination data: 123" in out.splitlines()
    assert out.splitlines()[-1] == "[SUCCESS] the memory was shared: both sides saw 123"


def test_physical_memory_sharing_withpid(daemon):
    program = "1_basic_features/memory/7_physical_memory_sharing_withpid.py"
    out = run_cann_example(daemon.address, program)
    assert "[INFO] A: process B may import the memory" in out
    assert "[INFO] B: copied 123 to the host" in out
    assert "[INFO] A: process B says it is done (1)" in out
    assert "Source data: 123" in out.splitlines()
    assert "Destination data: 123" in out.splitlines()
    assert out.splitlines()[-1] == "[SUCCESS] the memory was shared: both sides saw 123"


def test_physical_memory_sharing_withoutpid(daemon):
    program = "1_basic_features/memory/8_physical_memory_sharing_withoutpid.py"
    out = run_cann_example(daemon.address, program)
    assert "pid" not in out  # no whitelist
    assert "[INFO] B: copied 123 to the host" in out
    assert "Destination data: 123" in out.splitlines()
    assert out.splitlines()[-1] == "[SUCCESS] the memory was shared: both sides saw 123"
