"""The Runtime is a plain object owning parts (client/runtime/runtime.py): no base class, no
part of more than ~40 public methods, every public name in one part only -- and the flat
names of the Runtime before it had parts still work, with one FlatNameWarning each."""

from __future__ import annotations

import warnings

import pytest
from conftest import runtime_of

from simnpu.client.runtime import PARTS, FlatNameWarning, Runtime
from simnpu.client.runtime import runtime as runtime_module


def public(cls: type) -> list[str]:
    return [name for name in dir(cls) if not name.startswith("_")]


def test_the_runtime_has_no_base_but_object():
    assert Runtime.__bases__ == (object,)
    for cls in PARTS.values():
        assert cls.__bases__ == (object,), cls


def test_no_part_has_more_than_40_public_methods():
    sizes = {part: len(public(cls)) for part, cls in PARTS.items()}
    assert max(sizes.values()) <= 40, sizes


def test_each_flat_name_is_one_parts():
    owners: dict[str, list[str]] = {}
    for part, cls in PARTS.items():
        for name in public(cls):
            owners.setdefault(name, []).append(part)
    assert {name: parts for name, parts in owners.items() if len(parts) > 1} == {}
    assert runtime_module.FLAT_NAMES["malloc"] == "memory"
    assert runtime_module.FLAT_NAMES["synchronize_stream"] == "sync"


def test_the_old_flat_spelling_still_works_and_warns_once(daemon, monkeypatch):
    monkeypatch.setattr(runtime_module, "_warned", set())  # as in a fresh process
    with runtime_of(daemon.address) as rt:
        with pytest.warns(FlatNameWarning, match=r"Runtime\.malloc is Runtime\.memory\.malloc"):
            address = rt.malloc(4096)
        with pytest.warns(FlatNameWarning, match="memory.memory_stats"):
            stats = rt.memory_stats(0)
        assert stats == rt.memory.memory_stats(0)
        assert issubclass(FlatNameWarning, DeprecationWarning)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per name: the second use is silent
            rt.memory.free(rt.malloc(4096))
        rt.memory.free(address)
        with pytest.warns(FlatNameWarning, match="memory.uses_shared_memory"):
            assert rt.uses_shared_memory is rt.memory.uses_shared_memory
        with pytest.raises(AttributeError):
            rt.no_such_call  # noqa: B018 - the lookup is the test
