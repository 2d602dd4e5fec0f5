"""call_site: the user's file:line that each call carries, taken where the public call
entered (its cache is keyed by code object ids, so it must still tell lines and code objects
apart)."""

from __future__ import annotations

import ctypes
import gc
import inspect
import threading

from simnpu.client import transport


def _site() -> str:
    return transport.call_site()  # above the function that asks: the test's line


def test_each_line_of_a_function_is_its_own_site():
    first = _site()
    line = inspect.currentframe().f_lineno
    second = _site()
    assert first == f"{__file__}:{line - 1}"
    assert second == f"{__file__}:{line + 1}"
    assert [_site() for _ in range(3)] == [f"{__file__}:{line + 4}"] * 3


def test_code_made_and_dropped_at_run_time_names_its_own_lines():
    """Code objects compiled one after another (each freed before the next, so that their
    memory may be reused) each get their own site."""
    seen = []
    for lines in range(1, 6):
        source = "\n" * lines + "def call(site):\n    return site()\n"
        namespace: dict = {}
        exec(compile(source, f"<generated {lines}>", "exec"), namespace)  # noqa: S102
        seen.append(namespace["call"](_site))
        del namespace
    assert seen == [f"<generated {lines}>:{lines + 2}" for lines in range(1, 6)]


def test_frames_of_simnpu_are_skipped():
    """A call that goes through several of the client's own functions names the first
    frame outside them."""
    own: dict = {"__name__": "simnpu.client.made_up", "call_site": transport.call_site}
    source = "def outer():\n    return middle()\ndef middle():\n    return inner()\n"
    source += "def inner():\n    return call_site()\n"
    exec(compile(source, "<own>", "exec"), own)  # noqa: S102
    line = inspect.currentframe().f_lineno
    assert own["outer"]() == f"{__file__}:{line + 1}"
    assert own["middle"]() == f"{__file__}:{line + 2}"


def test_the_call_log_answers_for_its_last_65536_calls():
    """Requests and commands numbered past the log's size: each number still held answers
    with its own site (and a command with its stream, thread and record); older ones and
    requests are not commands."""
    log = transport.CallLog()
    size = 1 << 16
    for seq in range(1, size + 11):
        if seq % 2:
            assert log.take_command(f"c:{seq}", seq % 7, b"r%d" % seq) == seq
        else:
            assert log.take(f"r:{seq}", deferred=seq % 4 == 0) == seq
    last = size + 10
    assert log.site_of(last) == f"r:{last}"
    assert log.site_of(last - 1) == f"c:{last - 1}"
    assert log.command(last - 1) == ((last - 1) % 7, threading.get_ident(), b"r%d" % (last - 1))
    assert log.command(last) is None  # a request
    assert log.site_of(10) is None and log.command(9) is None  # overwritten by 65,546 and 65,545
    assert log.last_deferred() == last - 1 and log.last_command((last - 1) % 7) == last - 1
    log.sites_sent = last - 3
    assert log.unsent_sites() == (
        [last - 2, last - 1, last],
        [f"r:{last - 2}", f"c:{last - 1}", f"r:{last}"],
    )


def test_launches_leave_nothing_for_the_cyclic_collector(acl):
    """The call log keeps each launch in lists made once: 10,000 launches add no object
    the cyclic collector counts, so they trigger no collection of the program's heap (a
    tuple per call used to add 10,000)."""
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    empty, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "empty")
    assert ret == 0
    no_args = ctypes.create_string_buffer(1)
    launch = acl.rt.launch_kernel_with_host_args
    address = ctypes.addressof(no_args)
    assert launch(empty, 1, stream, None, address, 0) == 0
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        failed = sum(launch(empty, 1, stream, None, address, 0) != 0 for _ in range(10_000))
        added = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert failed == 0, acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0
    assert added < 1_000, f"10,000 launches added {added} objects the cyclic collector counts"
    assert acl.rt.destroy_stream(stream) == 0
