"""caller_site: the user's file:line that each asynchronous call carries (its cache is keyed
by code object ids, so it must still tell lines and code objects apart)."""

from __future__ import annotations

import inspect

from simnpu.client import transport


def _site() -> str:
    return transport.caller_site()  # the caller's caller: the test's line


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
    own: dict = {"__name__": "simnpu.client.made_up", "caller_site": transport.caller_site}
    source = "def outer():\n    return middle()\ndef middle():\n    return inner()\n"
    source += "def inner():\n    return caller_site()\n"
    exec(compile(source, "<own>", "exec"), own)  # noqa: S102
    line = inspect.currentframe().f_lineno
    assert own["outer"]() == f"{__file__}:{line + 1}"
    assert own["middle"]() == f"{__file__}:{line + 2}"
