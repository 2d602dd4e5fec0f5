"""The programs of examples/cann/ after the CANN runtime's IPC examples (events, notifies,
memory shared between processes), run against a real daemon."""

from __future__ import annotations

from cann_examples import run_cann_example


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
