"""The CANN runtime's label example (examples/cann/2_advanced_features/label/) run against a
real daemon."""

from __future__ import annotations

from cann_examples import run_cann_example


def test_simple_label_jumps_by_the_index_in_device_memory(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/label/0_simple_label.py")
    for line in (
        "[INFO]  Persistent label stream bound to the model runtime instance.",
        "[INFO]  Created label list with 2 labels.",
        "[INFO]  Submitted switch-label task with branch index 1.",
        "[INFO]  Set label 1 on the persistent stream.",
        "[INFO]  Model runtime instance build finished.",
        "[INFO]  Switch label executed successfully with branch index 1.",
        "[INFO]  Run the simple_label sample successfully.",
    ):
        assert line in out
    assert "[ERROR]" not in out
