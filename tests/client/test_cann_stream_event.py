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


def test_multi_stream(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/stream/2_multi_stream.py")
    assert out.count("The answer is 2.") == 3
    assert "Ordering by a stream synchronize." in out
    assert "Ordering by an event." in out
    assert "Ordering by a notify." in out
    assert "synchronize_stream_with_timeout returned 507046" in out
    assert "synchronize_event_with_timeout returned 507047" in out


def test_stream_config_query(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/stream/3_stream_config_query.py")
    assert "Config set: flags=0 priority=0" in out
    assert re.search(r"Stream id: [1-9]\d*\n", out)
    assert "Stream flags: 0\n" in out
    assert "Stream priority: 0\n" in out
    assert "[SUCCESS]" in out


def test_event_status(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/event/0_event_status.py")
    assert "Status of the new event: 0." in out
    assert "Status after the record, before any synchronize: 0." in out
    assert "Status after synchronize_event: 1." in out
    assert "The answer is 1." in out


def test_event_timestamp(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/event/1_event_timestamp.py")
    assert "After the short task the answer is 0." in out
    assert "After the long task the answer is 1." in out
    starts = [int(n) for n in re.findall(r"Start event timestamp: (\d+) us", out)]
    ends = [int(n) for n in re.findall(r"End event timestamp: (\d+) us", out)]
    assert len(starts) == len(ends) == 2
    assert all(0 < start <= end for start, end in zip(starts, ends))
    long_ms = float(re.search(r"The long task took ([\d.]+) ms", out).group(1))
    assert long_ms >= 2000.0  # the kernel sleeps 2 s: a lower bound, not a speed
    assert "The event times are as expected." in out
