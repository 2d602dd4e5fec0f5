"""The pure parts of kernel processes: grants in whole pages, and the checks of what an
untrusted kernel process reports (server/units/kernel_processes.py,
server/units/report_codec.py). The processes themselves
are tested against real daemons (tests/integration/test_kernel_isolation.py)."""

from __future__ import annotations

import json
import time

import pytest

from simnpu.proto import codes
from simnpu.server.core.unit_protocol import MAX_OUTPUT, PAGE, page_spans
from simnpu.server.units.kernel_processes import overlaps
from simnpu.server.units.report_codec import (
    MAX_MESSAGE,
    BadReport,
    decode_report,
    encode_accesses,
    encode_results,
)


def test_spans_are_whole_pages_sorted_and_merged():
    spans = page_spans([(0, 5000, 100), (1, 0, 1), (0, 0, 4096), (0, 8192, 4096), (0, 0, 0)])
    assert spans == ((0, 0, 3 * PAGE), (1, 0, PAGE))


def test_spans_keep_a_gap_of_a_page():
    assert page_spans([(0, 0, PAGE), (0, 2 * PAGE, 1)]) == ((0, 0, PAGE), (0, 2 * PAGE, PAGE))


def test_overlap_is_by_device_and_byte():
    spans = ((0, PAGE, PAGE),)
    assert overlaps(spans, 0, PAGE - 1, 2)
    assert not overlaps(spans, 0, 0, PAGE)
    assert not overlaps(spans, 0, 2 * PAGE, 10)
    assert not overlaps(spans, 1, PAGE, PAGE)


def test_results_of_the_batch_pass_with_times_clamped():
    sent = time.monotonic_ns()
    data = encode_results(
        [
            (7, 0, sent + 1, sent + 2, "", "printed", False, 0),
            (8, 507015, 0, 1 << 62, "boom", "", True, 3),
        ]
    )
    (first, second) = decode_report(data, [7, 8], sent)
    assert first == (7, 0, sent + 1, sent + 2, "", "printed", False, 0)
    token, code, start, end, message, output, overflow, failed = second
    assert (token, code, message, output, overflow, failed) == (8, 507015, "boom", "", True, 3)
    assert start == sent and sent <= end <= time.monotonic_ns()


@pytest.mark.parametrize(
    "report",
    [
        ["results", [[9, 0, 0, 0, "", "", False, 0]]],  # another task's token
        ["results", [[7, 0, 0, 0, "", "", False, 0], [8, 0, 0, 0, "", "", False, 0]]],  # too many
        ["results", []],  # fewer
        ["results", [[7, "0", 0, 0, "", "", False, 0]]],  # a code that is not a number
        ["results", [[7, 0, 0.5, 0, "", "", False, 0]]],
        ["results", [[7, 0, 0, 0, 5, "", False, 0]]],  # a message that is not text
        ["results", [[7, 0, 0, 0, "", ["x"], False, 0]]],  # an output that is not text
        ["results", [[7, 0, 0, 0, "", "", 1, 0]]],  # an overflow flag that is not a bool
        ["results", [[7, 0, 0, 0, "", "", False, "1"]]],  # a failed index that is not a number
        ["results", [[7, 0, 0, 0, "", "", False]]],  # no failed index
        ["accesses", 9, [], None],  # accesses of another task
        ["accesses", 7, [[1, 2, 3]], None],
        ["accesses", 7, [], [1, 2, "x", 3]],
        ["ready"],
        {"results": []},
    ],
)
def test_anything_else_is_a_bad_report(report):
    with pytest.raises(BadReport):
        decode_report(json.dumps(report).encode(), [7], 0)


def test_not_json_is_a_bad_report():
    with pytest.raises(BadReport):
        decode_report(b"\x80\x04K\x01.", [7], 0)  # a pickle: never unpickled
    with pytest.raises(BadReport):
        decode_report(b"[" * 100_000, [7], 0)


def test_codes_other_than_a_kernels_become_507015_and_messages_and_output_are_cut():
    data = encode_results(
        [
            (
                7,
                codes.ACL_ERROR_RT_PARAM_INVALID,
                0,
                0,
                "x" * (2 * MAX_MESSAGE),
                "y" * 4 * MAX_OUTPUT,
                False,
                0,
            )
        ]
    )
    ((_, code, _, _, message, output, _, _),) = decode_report(data, [7], 0)
    assert code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert len(message) == MAX_MESSAGE
    assert len(output) == MAX_OUTPUT


def test_accesses_of_the_batch_pass():
    data = encode_accesses((7, [(1, 2, 1, 0, 1)], (5, 4, "rw", 0)))
    assert decode_report(data, [7], 0) == (7, [(1, 2, 1, 0, 1)], (5, 4, "rw", 0))


def test_a_message_that_is_not_unicode_is_made_so():
    """A lone surrogate (valid JSON, not UTF-8) would break the reply the message goes in."""
    data = encode_results(
        [(7, codes.ACL_ERROR_RT_AICORE_EXCEPTION, 0, 0, "a\ud800b", "", False, 0)]
    )
    ((_, _, _, _, message, _, _, _),) = decode_report(data, [7], 0)
    assert message == "a?b"
