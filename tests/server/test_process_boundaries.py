"""`server/` has no module that runs in two processes: the daemon and each process it starts
share only the protocol between them (docs/decisions/owned-parts-and-folders.md, "Process
boundaries").

Each process's modules are the import closure of its entry module within simnpu.server:
every `import` and `from ... import`, at module level or in a function (not those under
`if TYPE_CHECKING:`), followed transitively, with the packages they lie in. A child that
shared a module with the daemon beyond the protocol would run the daemon's handling of
it, or the daemon its loop. A spawned worker is also asked what it has imported.
"""

from __future__ import annotations

import ast
import pickle
import time
from functools import cache
from pathlib import Path

import pytest

import simnpu.server
from simnpu.server.core.executor import Unit, UnitKind
from simnpu.server.core.unit_protocol import LoadModule, Ready, RunKernel

SERVER = Path(simnpu.server.__file__).parent

DAEMON = ("simnpu.server.control.daemon", "simnpu.server.control.cli")
CHILDREN = {
    "worker": "simnpu.server.units.worker_main",
    "kernel zygote": "simnpu.server.units.zygote_main",
    "kernel process": "simnpu.server.units.kernel_process_main",
    "Gloo exchange process": "simnpu.server.hccl.gloo_exchange_main",
    "kernel module parser": "simnpu.server.kernels.parse_main",
}
PROTOCOL = {  # what the daemon and a process it starts may share, and why
    "simnpu.server.core.unit_protocol": "the items of a batch and a unit's reports",
    "simnpu.server.units.report_codec": "what a kernel process reports, encoded and checked",
    "simnpu.server.hccl.gloo_exchange_protocol": "the steps an exchange process runs, its reports",
    "simnpu.server.units.gc_tuning": "the collector tuning each process applies to itself",
    "simnpu.server.units.kernel_bounds": "what a kernel process may hold, counted from outside",
}


def _file(module: str) -> Path | None:
    parts = module.split(".")[2:]  # below simnpu.server
    path = SERVER.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST):
    """The import statements under `node` that run (none under `if TYPE_CHECKING:`)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(other)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _import_nodes(child)


def _with_packages(module: str) -> set[str]:
    """`module` and the packages of simnpu.server it lies in (importing it runs theirs)."""
    parts = module.split(".")
    return {".".join(parts[:end]) for end in range(2, len(parts) + 1)}


@cache
def imports_of(module: str) -> frozenset[str]:
    """The modules of simnpu.server that `module` imports, directly."""
    path = _file(module)
    assert path is not None, f"no module {module}"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]  # a module or not
        for name in names:
            if name.startswith("simnpu.server") and _file(name):
                found |= _with_packages(name)
    return frozenset(found)


@cache
def closure(*entries: str) -> frozenset[str]:
    """Every module of simnpu.server that importing `entries` imports."""
    seen: set[str] = set()
    todo = [module for entry in entries for module in _with_packages(entry)]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(imports_of(module) - seen)
    return frozenset(seen)


def _packages(modules: frozenset[str]) -> set[str]:
    return {m for m in modules if (path := _file(m)) is not None and path.name == "__init__.py"}


@pytest.mark.parametrize("process", sorted(CHILDREN))
def test_a_process_shares_only_the_protocol_with_the_daemon(process):
    shared = closure(*DAEMON) & closure(CHILDREN[process])
    assert set(shared) - _packages(shared) - set(PROTOCOL) == set()


def test_every_module_run_as_a_program_is_a_process_listed_here():
    """A module that runs as a program (`if __name__ == "__main__":`, for `python -m`) is a
    process's entry: the daemon's (`python -m simnpu.server`, its CLI) or a child's above,
    so that no module is both a child's program and imported by the daemon."""
    programs = set()
    for path in SERVER.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if (
                isinstance(node, ast.If)
                and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name)
                and node.test.left.id == "__name__"
            ):
                module = ".".join(
                    ["simnpu", *path.relative_to(SERVER.parent).with_suffix("").parts]
                )
                programs.add(module)
    assert programs - {"simnpu.server.__main__", *DAEMON} <= set(CHILDREN.values())
    assert "simnpu.server.kernels.parse_main" in programs  # the walk sees a `-m` program


def test_the_daemon_imports_no_unit_module_for_what_the_core_keeps():
    """CheckedBounds, the output bounds (server/core/unit_protocol.py), PendingOutput
    (server/core/owner.py) and the status bytes aclrtGetOverflowStatus writes
    (server/core/tasks/overflow.py) are the core's: the daemon imports none of the unit
    modules they were in."""
    units = {"access_log", "device_printf", "float_overflow"}
    assert closure(*DAEMON) & {f"simnpu.server.units.{name}" for name in units} == set()


def test_the_closures_are_those_of_the_processes():
    """The walk finds what each process runs: its loop, and not the daemon's side."""
    daemon = closure(*DAEMON)
    assert {
        "simnpu.server.units.process_executor",
        "simnpu.server.units.kernel_processes",
        "simnpu.server.hccl.gloo_exchange",
        "simnpu.server.core.scheduler",
    } <= daemon
    assert "simnpu.server.units.runner" in closure(CHILDREN["worker"])
    assert "simnpu.server.units.runner" in closure(CHILDREN["kernel process"])
    assert "simnpu.server.units.kernel_process_main" in closure(CHILDREN["kernel zygote"])
    assert "simnpu.server.units.collective_pieces" in closure(CHILDREN["Gloo exchange process"])
    for entry in CHILDREN.values():
        assert entry not in daemon
    assert set(PROTOCOL) <= {module for entry in CHILDREN.values() for module in closure(entry)}


def test_the_daemon_spawns_each_process_at_its_main_by_name():
    """The daemon names a child's main (server/units/spawning.py); the child, unpickling
    the name, gets the function."""
    from simnpu.server.hccl import gloo_exchange
    from simnpu.server.units import kernel_processes, process_executor

    for target, process in (
        (process_executor._WORKER_MAIN, "worker"),
        (gloo_exchange._EXCHANGE_MAIN, "Gloo exchange process"),
    ):
        main = pickle.loads(pickle.dumps(target))
        assert (main.__module__, main.__name__) == (CHILDREN[process], "main")
    # the zygote is a program, started in a clean environment (`python -P -m`)
    assert kernel_processes.ZYGOTE_MAIN == CHILDREN["kernel zygote"]


PROBE = """
import sys

def modules(ctx):
    ctx.printf("%s\\n", " ".join(sorted(name for name in sys.modules if name.startswith("simnpu"))))
"""


def _reports(executor, unit, wanted, timeout_s=60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for got_unit, _, report in executor.wait(0.2):
            if got_unit is unit and wanted(report):
                return report
    raise AssertionError("the worker did not report in time")


def test_a_spawned_worker_imports_nothing_of_the_daemons_side(spawn_environment):
    from simnpu.server.memory.device_backing import BackingLog
    from simnpu.server.memory.window_table import WindowTable
    from simnpu.server.units.process_executor import ProcessExecutor

    unit = Unit(UnitKind.AI_CORE, 0, 0, 0)
    executor = ProcessExecutor([unit], [], WindowTable(), BackingLog())
    executor.start([unit])
    try:
        _reports(executor, unit, lambda report: isinstance(report, Ready))
        executor.send(
            unit,
            [
                LoadModule.pack(1, PROBE, "<probe>"),
                RunKernel.pack(7, 1, "modules", (), 0, 1, 1, (), False),
            ],
        )
        ((_, code, _, _, message, output, *_),) = _reports(
            executor, unit, lambda report: isinstance(report, list)
        )
    finally:
        executor.stop()
    assert code == 0, message
    imported = set(output.splitlines()[-1].split())
    assert "simnpu.server.units.worker_main" in imported
    assert {m for m in imported if m.startswith("simnpu.server.control")} == set()
    daemons_side = closure(*DAEMON) - closure(CHILDREN["worker"])
    assert imported & daemons_side == set()
