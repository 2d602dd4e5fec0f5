"""examples/cann/README.md lists every program of the folder, and the suite runs each one."""

from __future__ import annotations

import pathlib
import re

from cann_examples import CANN_EXAMPLES

TESTS = pathlib.Path(__file__).resolve().parent


def _programs() -> set[str]:
    return {str(path.relative_to(CANN_EXAMPLES)) for path in CANN_EXAMPLES.rglob("*.py")}


def test_the_readme_lists_every_program_and_only_them():
    readme = (CANN_EXAMPLES / "README.md").read_text()
    listed = set(re.findall(r"^\| `[^`]+` \| `([^`]+\.py)` \|", readme, flags=re.M))
    assert listed == _programs()


def test_every_program_is_run_by_a_test():
    """By its file name: tests name a folder once and its programs under it."""
    tests = "".join(path.read_text() for path in TESTS.glob("test_cann_*.py"))
    names = {pathlib.PurePath(program).name for program in _programs()}
    assert {name for name in names if f'{name}"' not in tests} == set()
