"""The bounded parser of a client's kernel module (server/kernels/discovery.py): how its
failures read."""

from __future__ import annotations

import subprocess

import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.kernels import discovery


def test_a_parser_that_exits_without_an_answer_says_its_last_words(monkeypatch):
    """An interpreter that fails before it answers (an import error, say) is named in the
    error, so the cause can be read from the client's side."""

    def failed(args, **_):
        return subprocess.CompletedProcess(args, 1, b"", b"Traceback ...\nImportError: gone\n")

    monkeypatch.setattr(discovery.subprocess, "run", failed)
    with pytest.raises(NpuError) as raised:
        discovery.discover("x = 1\n", "m.py", 1 << 20)
    assert raised.value.code == codes.ACL_ERROR_INVALID_FILE
    assert "exited with code 1 without an answer (ImportError: gone)" in str(raised.value)


def test_a_real_parse_finds_the_kernels():
    source = 'from simnpu import kernel\n\n@kernel("ptr")\ndef k(ctx, p):\n    pass\n'
    assert list(discovery.discover(source, "m.py", 1 << 20)) == ["k"]
