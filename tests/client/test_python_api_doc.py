"""docs/python-api.md against the code: its reference part is what docs/gen_python_api.py
renders from simnpu.client today, every public call says whether it blocks and which ACL call
it stands on, and the page's example runs against a real daemon."""

from __future__ import annotations

import re

import pytest
from conftest import docs_script, stale_lines

gen = docs_script("gen_python_api")


def test_the_page_is_what_the_code_renders():
    diff = stale_lines(gen)
    assert not diff, f"docs/python-api.md is out of date: run python docs/gen_python_api.py\n{diff}"


def test_every_public_name_has_an_entry():
    import simnpu.client as api

    headings = re.findall(r"^#### `(?:class )?([A-Za-z_]+)", gen.render(), re.MULTILINE)
    assert set(api.__all__) <= set(headings)


def test_a_changed_docstring_or_signature_makes_the_page_stale(monkeypatch):
    from simnpu.client.stream import Stream

    before = gen.render()
    monkeypatch.setattr(Stream.query, "__doc__", "aclrtStreamQuery, reworded. Blocks.")
    assert gen.render() != before

    def query(self, timeout_ms: int = 0) -> bool:
        """aclrtStreamQuery. Blocks."""

    monkeypatch.setattr(Stream, "query", query)
    assert "Stream.query(timeout_ms: int = 0) -> bool" in gen.render()


@pytest.mark.parametrize(
    "docstring, complaint",
    [
        (None, "has no docstring"),
        ("aclrtStreamQuery: True when done.", "neither Blocks, Asynchronous nor Local"),
        ("True when done. Blocks.", "names no aclXxx call"),
    ],
)
def test_a_docstring_that_leaves_out_what_the_page_promises_is_refused(
    monkeypatch, docstring, complaint
):
    from simnpu.client.stream import Stream

    monkeypatch.setattr(Stream.query, "__doc__", docstring)
    with pytest.raises(gen.PageError, match=complaint):
        gen.render()


def test_a_public_name_left_out_of_the_sections_is_refused(monkeypatch):
    import simnpu.client as api

    monkeypatch.setattr(api, "__all__", [*api.__all__, "new_call"])
    with pytest.raises(gen.PageError, match=r"missing \['new_call'\]"):
        gen.render()


def test_the_example_runs(npu):
    page = gen.PAGE.read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", page, re.DOTALL)
    assert example is not None
    exec(compile(example.group(1), "python-api.md", "exec"), {})  # it asserts its result
    assert npu.runtime().memory.memory_limit(0)[1] == 0  # it freed what it allocated
