"""What each folder of the daemon may import: the `May import:` sentence of its `__init__.py`
docstring, checked against every import of every module in the folder -- at module level,
under TYPE_CHECKING and inside functions alike (docs/decisions/owned-parts-and-folders.md).

A folder may always import itself and the packages it lies in (`import simnpu.server` for
its path); imports of other packages than the project's own (the standard library, numpy,
grpc) are free.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[2] / "server"
FOLDERS = sorted(path.name for path in SERVER.iterdir() if (path / "__init__.py").is_file())
OURS = ("simnpu", "acl", "hccl")  # the project's top-level packages (acl, hccl: the clients')
AROUND = ("simnpu", "simnpu.server")  # the packages every folder lies in


def allowed(folder: str) -> list[str]:
    """The packages the folder's docstring says it may import, and the folder itself."""
    docstring = ast.get_docstring(ast.parse((SERVER / folder / "__init__.py").read_text()))
    found = re.search(r"May import:(.*?)\.(?:\s|$)", docstring or "", re.DOTALL)
    assert found is not None, f"server/{folder}/__init__.py does not say what it may import"
    return [*re.findall(r"\bsimnpu(?:\.\w+)+", found.group(1)), f"simnpu.server.{folder}"]


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what it names) of every import of the module at `path`: `module` for an import,
    `module.name` for a from-import (relative ones resolved), wherever it stands."""
    package = ["simnpu", *path.relative_to(SERVER.parent).parts[:-1]]  # (an __init__'s too)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}"


def violations(folder: str) -> list[str]:
    """The imports of the folder's modules that its docstring does not allow."""
    rules = allowed(folder)
    found = []
    for path in sorted((SERVER / folder).rglob("*.py")):
        for line, name in imports(path):
            if name.split(".")[0] not in OURS or name in AROUND:
                continue
            if not any(name == rule or name.startswith(rule + ".") for rule in rules):
                found.append(f"{path.relative_to(SERVER.parent)}:{line} imports {name}")
    return found


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_imports_only_what_its_docstring_allows(folder: str) -> None:
    assert violations(folder) == []


def test_relative_imports_are_resolved_in_their_package() -> None:
    names = {name for _, name in imports(SERVER / "core" / "tasks" / "kernel.py")}
    assert "simnpu.server.core.tasks.base.DeviceWork" in names
    assert "simnpu.server.core.unit_protocol.RunKernel" in names
