"""The gRPC addresses simnpu understands (service.parse_address), without a daemon."""

from __future__ import annotations

import pytest

from simnpu.proto.service import Address, default_address, parse_address


@pytest.mark.parametrize(
    "address, parts",
    [
        ("unix:///run/simnpu/simnpu.sock", Address("/run/simnpu/simnpu.sock", "", 0)),
        ("unix:/run/npu.sock", Address("/run/npu.sock", "", 0)),
        ("unix:run/npu.sock", Address("run/npu.sock", "", 0)),
        ("127.0.0.1:50151", Address(None, "127.0.0.1", 50151)),
        ("npu:50151", Address(None, "npu", 50151)),
        ("[::1]:50151", Address(None, "::1", 50151)),
        ("0.0.0.0:1", Address(None, "0.0.0.0", 1)),
    ],
)
def test_the_accepted_forms(address, parts):
    assert parse_address(address) == parts


@pytest.mark.parametrize(
    "address",
    [
        "/tmp/x.sock",
        "x.sock",
        "unix://x.sock",
        "unix:",
        "unix:///",
        "host:",
        "host:0",
        "host:65536",
        "::1:50151",
        "[::1:50151",
    ],
)
def test_everything_else_is_refused(address):
    with pytest.raises(ValueError):
        parse_address(address)


def test_the_default_address_is_accepted():
    assert parse_address(default_address(None, 1000)).path == "/tmp/simnpu-1000/simnpu.sock"
