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
