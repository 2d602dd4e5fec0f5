"""Tenants without a daemon: the token file's entries (proto/service.py), which tenant a
token or a Unix uid is (server/control/credentials.py), and who sees whom
(server/core/tenants.py). The real-daemon tests are tests/integration/test_tenants.py."""

from __future__ import annotations

import os

import pytest

from simnpu.proto import service
from simnpu.server.control.credentials import UNVERIFIED, Peer, Tenancy
from simnpu.server.control.daemon_config import DaemonConfig
from simnpu.server.core.tenants import OPERATOR, Tenant


def test_a_token_file_names_the_operator_first_then_each_tenant():
    text = "# tokens\n\n  op-token  \nalice a-token\n# bob left\nbob b-token\n"
    assert service.token_entries(text) == [
        ("operator", "op-token"),
        ("alice", "a-token"),
        ("bob", "b-token"),
    ]
    assert service.token_entries("admin op-token\n") == [("admin", "op-token")]
    assert service.token_entries("") == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("op\nnameless\n", "line 2: a tenant's entry needs a name"),
        ("op\nalice a b\n", "line 2: expected TOKEN or NAME TOKEN, not 3 words"),
        ("op\nalice a\nalice b\n", "line 3: the name 'alice' is given twice"),
        ("op\nalice op\n", "line 2: this token is given twice"),
        (f"op\n{'n' * 65} t\n", "line 2: a name is 1..64 printable characters"),
    ],
)
def test_a_malformed_token_file_is_refused_by_line(text, problem):
    with pytest.raises(ValueError, match=problem):
        service.token_entries(text)


def test_a_client_sends_the_first_entrys_token(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alice a-token\nbob b-token\n")
    assert service.read_token_file(str(path)) == "a-token"
    path.write_text("plain-token\n")
    assert service.read_token_file(str(path)) == "plain-token"


def test_a_token_is_its_entrys_tenant():
    tenancy = Tenancy("op-token", (("alice", "a-token"), ("bob", "b-token")))
    assert tenancy.of_token("op-token") == OPERATOR
    assert tenancy.of_token("a-token") == Tenant("token alice")
    assert tenancy.of_token("b-token") == Tenant("token bob")
    assert tenancy.of_token("") is None and tenancy.of_token("a-tokenX") is None
    assert Tenancy(None, ()).of_token("") is None  # no token: no TCP client gets in


def test_a_unix_client_is_the_operator_only_as_the_daemons_uid_or_root():
    tenancy = Tenancy("op-token", ())
    other = os.getuid() + 1000
    assert tenancy.of_unix(Peer("p", 1, os.getuid())) == OPERATOR
    assert tenancy.of_unix(Peer("p", 1, 0)) == OPERATOR
    assert tenancy.of_unix(Peer("p", 0, None)) == UNVERIFIED  # no ticket: not the operator
    assert tenancy.of_unix(Peer("p", 1, other)) == Tenant(f"uid {other}")


def test_the_operator_sees_every_tenant_and_a_tenant_only_itself():
    alice, bob = Tenant("token alice"), Tenant("token bob")
    assert OPERATOR.sees(alice) and OPERATOR.sees(OPERATOR)
    assert alice.sees(alice) and not alice.sees(bob) and not alice.sees(OPERATOR)
    assert str(OPERATOR) == "the operator" and str(alice) == "token alice"


def test_tenants_tokens_need_the_operators():
    config = DaemonConfig(listen=["127.0.0.1:1"], tenants=(("alice", "a"),))
    with pytest.raises(ValueError, match="operator's token first"):
        config.validate()
