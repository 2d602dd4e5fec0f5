"""The programs of examples/cann/3_memory_advanced/ (host_register, managed_memory) against a
real daemon: each runs as a user runs it and prints what the vendor's example shows."""

from __future__ import annotations

from cann_examples import run_cann_example

ADVANCED = "3_memory_advanced"


def test_simple_zero_copy(daemon):
    out = run_cann_example(daemon.address, f"{ADVANCED}/host_register/0_simple_zero_copy.py")
    assert "[INFO]  Three host buffers are registered and have device addresses." in out
    assert "[INFO]  All 16384 float16 sums are right, read in the mapped host memory." in out
    assert "[INFO]  The simple_zero_copy sample ran successfully." in out


def test_uvm_allocate(daemon):
    out = run_cann_example(daemon.address, f"{ADVANCED}/managed_memory/0_uvm_allocate.py")
    assert "[INFO]  The uvm_allocate sample ran successfully." in out
    assert "error ratio: 0.0000, tolerance: 0.0010" in out
    assert "[SUCCESS] result correct" in out
