"""The programs of examples/cann/1_basic_features/memory/ against a real daemon: each runs
as a user runs it and prints the values the vendor's example shows."""

from __future__ import annotations

from cann_examples import run_cann_example

MEMORY = "1_basic_features/memory"


def test_h2h_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/0_h2h_memory_copy.py")
    assert "[INFO]  Source data: 123" in out and "[INFO]  Destination data: 123" in out


def test_h2d_sync_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/1_h2d_sync_memory_copy.py")
    assert "[INFO]  Source data: 123" in out
    assert "\nDestination data: 123\n" in out  # printed by the kernel


def test_h2d_async_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/2_h2d_async_memory_copy.py")
    assert "[INFO]  Source data: 123" in out
    assert "\nDestination data: 123\n" in out


def test_d2d_sync_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/5_d2d_sync_memory_copy.py")
    assert "\nSource data: 123\n" in out and "\nDestination data: 123\n" in out  # both kernels
    assert out.index("Source data: 123") < out.index("Destination data: 123")


def test_d2h_sync_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/3_d2h_sync_memory_copy.py")
    assert "\nSource data: 123\n" in out  # printed by the kernel, at the synchronize
    assert "[INFO]  Destination data: 123" in out
    assert out.index("Source data: 123") < out.index("Destination data: 123")


def test_d2h_async_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/4_d2h_async_memory_copy.py")
    assert "\nSource data: 123\n" in out
    assert "[INFO]  Destination data: 123" in out


def test_d2d_async_memory_copy(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/6_d2d_async_memory_copy.py")
    assert "\nSource data: 123\n" in out and "\nDestination data: 123\n" in out  # both kernels
    assert out.index("Source data: 123") < out.index("Destination data: 123")


def test_multistream_sync_memory(daemon):
    out = run_cann_example(daemon.address, f"{MEMORY}/9_multistream_sync_memory.py")
    written = out.index("[INFO]  Flag written by the writing thread: 123")
    # stream A's synchronize returns only after stream B's write, which follows the flag
    assert out.index("[INFO]  Stream A: the word met the condition") > written
    assert out.index("[INFO]  Flag read by the waiting thread: 123") > written
    assert "the streams synchronized through memory" in out
