"""docs/architecture.md's module index against the code: it is what docs/gen_module_index.py
renders from the modules' docstrings today, every module has a docstring, and no module of
server/ or client/ passes the size limit without saying why it must be one module."""

from __future__ import annotations

from conftest import docs_script, stale_lines

gen = docs_script("gen_module_index")


def test_the_index_is_what_the_docstrings_say():
    diff = stale_lines(gen)
    assert not diff, (
        f"docs/architecture.md's module index is out of date: run python "
        f"docs/gen_module_index.py\n{diff}"
    )


def test_every_installed_module_is_indexed():
    """Each .py file of every installed package has its row (or heads its package)."""
    index = gen.render()
    for name, folder in gen.packages():
        assert f"### `{name}` (" in index
        for path in folder.glob("*.py"):
            relative = path.relative_to(gen.ROOT).as_posix()
            if path.name != "__init__.py" and relative not in gen.GENERATED:
                assert f"| `{path.name}` |" in index, f"{relative} is not in the index"


def test_a_module_without_a_docstring_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    module = tmp_path / "server" / "quiet.py"
    module.parent.mkdir()
    module.write_text("X = 1\n")
    try:
        gen.summary(module)
    except gen.IndexProblem as problem:
        assert "server/quiet.py has no docstring" in str(problem)
    else:
        raise AssertionError("a module without a docstring was indexed")


def test_a_long_module_must_say_why_it_is_one(tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    folder = tmp_path / "client"
    folder.mkdir()
    body = "\n" * gen.MAX_LINES
    long = folder / "long.py"
    long.write_text(f'"""Many things."""\n{body}')
    explained = folder / "explained.py"
    explained.write_text(f'"""One thing.\n\n{gen.WHY} its parts share one lock."""\n{body}')
    short = tmp_path / "shm.py"  # outside server/ and client/: not bounded
    short.write_text(f'"""Long but elsewhere."""\n{body}')
    try:
        gen.summary(long)
    except gen.IndexProblem as problem:
        assert "client/long.py has" in str(problem) and gen.WHY in str(problem)
    else:
        raise AssertionError("a long module that does not say why was indexed")
    assert gen.summary(explained) == "One thing."
    assert gen.summary(short) == "Long but elsewhere."
