"""The programs of examples/cann/1_basic_features/stream/ and .../event/ against a real
daemon: what each prints is what the CANN runtime's example shows."""

from __future__ import annotations

import re

from cann_examples import run_cann_example


def test_simple_stream(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/stream/0_simple_stream.py")
    assert "Result after the default stream's task: 1." in out
    assert "Result after the created stream's task: 2." in out
    assert "Stream status after the synchronize: 0." in out
    assert "Result after the loop: 3002." in out


def test_stream_with_failure_mode(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/stream/1_stream_with_failure_mode.py")
    assert "Continuing on failure, the result is 2." in out
    assert "Stopping on failure, the result is 1." in out
    assert len(re.findall(r"synchronize_stream returned [1-9]\d* \(the failing kernel\)", out)) == 2
    assert "acl.rt.stream_stop returned 0." in out
    assert "acl.rt.stream_abort returned 0." in out
    assert re.search(r"after the abort\) returned [1-9]\d*, as expected", out)
    assert re.search(r"Stream state callback \(stream_failure_mode_sample\): .* state=", out)
    assert "ran as expected" in out
