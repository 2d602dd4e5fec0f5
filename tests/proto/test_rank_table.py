"""Rank tables (HcclCommInitClusterInfo): what is read, and what HCCL would refuse, with
its HcclResult."""

from __future__ import annotations

import copy
import json

import pytest

from simnpu.proto import hccl_types as ht
from simnpu.proto import rank_table

TABLE = {
    "status": "completed",
    "version": "1.0",
    "server_count": "1",
    "server_list": [
        {
            "server_id": "node_0",
            "device": [
                {"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "1"},
                {"device_id": "1", "device_ip": "192.168.1.9", "rank_id": "0"},
            ],
        }
    ],
}


def changed(edit) -> str:
    table = copy.deepcopy(TABLE)
    edit(table)
    return json.dumps(table)


def refused(text: str) -> tuple[int, str]:
    with pytest.raises(rank_table.RankTableError) as caught:
        rank_table.parse(text)
    return caught.value.result, caught.value.message


def test_a_table_gives_its_ranks_by_rank_id_with_server_and_device():
    table = rank_table.parse(json.dumps(TABLE))
    assert table.completed and table.servers == ("node_0",)
    assert [(r.rank, r.server_id, r.server_index, r.device_id) for r in table.ranks] == [
        (0, "node_0", 0, 1),
        (1, "node_0", 0, 0),
    ]
    assert table.entry(0, 1).device_id == 1


def test_the_same_table_written_otherwise_is_the_same_world():
    text = json.dumps(TABLE)
    reordered = json.dumps(dict(reversed(list(TABLE.items()))), indent=4)
    assert rank_table.parse(text).key == rank_table.parse(reordered).key
    other = changed(lambda t: t["server_list"][0]["device"][0].update(device_ip="10.0.0.1"))
    assert rank_table.parse(other).key != rank_table.parse(text).key


def test_keys_hccl_does_not_read_are_ignored_and_version_1_2_is_read():
    def extend(table):
        table["version"] = "1.2"
        table["server_list"][0]["host_ip"] = "172.16.0.100"
        table["server_list"][0]["device"][0]["super_device_id"] = "0"
        table["super_pod_list"] = [{"super_pod_id": "0"}]

    assert len(rank_table.parse(changed(extend)).ranks) == 2


def test_server_count_is_optional_and_device_ip_too_on_one_server():
    def strip(table):
        del table["server_count"]
        for device in table["server_list"][0]["device"]:
            del device["device_ip"]

    assert len(rank_table.parse(changed(strip)).ranks) == 2


@pytest.mark.parametrize(
    "edit, result, words",
    [
        (lambda t: t.pop("version"), ht.HCCL_E_NOT_SUPPORT, "no version"),
        (lambda t: t.update(version="2.0"), ht.HCCL_E_NOT_SUPPORT, "'2.0' is not supported"),
        (lambda t: t.pop("status"), ht.HCCL_E_NOT_FOUND, "has no status"),
        (lambda t: t.pop("server_list"), ht.HCCL_E_NOT_FOUND, "no server_list"),
        (lambda t: t.update(server_list=[]), ht.HCCL_E_PARA, "server_list is empty"),
        (lambda t: t.update(server_count=1), ht.HCCL_E_PARA, "not a JSON string"),
        (lambda t: t.update(server_count="2"), ht.HCCL_E_PARA, "server_count is 2"),
        (lambda t: t.update(server_count="one"), ht.HCCL_E_PARA, "not a decimal number"),
        (lambda t: t["server_list"][0].pop("server_id"), ht.HCCL_E_NOT_FOUND, "no server_id"),
        (lambda t: t["server_list"][0].update(server_id=""), ht.HCCL_E_PARA, "empty"),
        (lambda t: t["server_list"][0].pop("device"), ht.HCCL_E_NOT_FOUND, "no device list"),
        (lambda t: t["server_list"][0].update(device=[]), ht.HCCL_E_PARA, "empty"),
        (
            lambda t: t["server_list"][0]["device"][0].update(rank_id="2"),
            ht.HCCL_E_PARA,
            "not 0 .. 1, each once: [0, 2]",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].update(rank_id="0"),
            ht.HCCL_E_PARA,
            "not 0 .. 1, each once: [0, 0]",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].update(rank_id="-1"),
            ht.HCCL_E_PARA,
            "not a decimal number",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].pop("device_id"),
            ht.HCCL_E_NOT_FOUND,
            "no device_id",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].update(device_id="16"),
            ht.HCCL_E_PARA,
            "device_id 16 is over 15",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].update(device_ip="192.168.1.300"),
            ht.HCCL_E_PARA,
            "not an IP address",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].update(device_ip="192.168.1.9"),
            ht.HCCL_E_PARA,
            "is also",
        ),
        (
            lambda t: t["server_list"][0]["device"][0].update(device_ip="10.0.0.1,10.0.0.2"),
            ht.HCCL_E_PARA,
            "different numbers of device_ip",
        ),
        (
            lambda t: (
                t.pop("server_count")
                and t["server_list"].append(
                    {"server_id": "node_0", "device": [{"device_id": "0", "rank_id": "2"}]}
                )
            ),
            ht.HCCL_E_PARA,
            "'node_0' appears twice",
        ),
        (
            lambda t: (
                t.update(server_count="2")
                or t["server_list"].append(
                    {"server_id": "node_1", "device": [{"device_id": "0", "rank_id": "2"}]}
                )
            ),
            ht.HCCL_E_NOT_FOUND,
            "has no device_ip",
        ),
    ],
)
def test_what_hccl_refuses_is_refused_with_its_result(edit, result, words):
    code, message = refused(changed(edit))
    assert code == result, message
    assert words in message


def test_what_is_no_table_at_all():
    assert refused("{")[0] == ht.HCCL_E_INTERNAL  # HCCL fails to load it
    assert refused("[]")[0] == ht.HCCL_E_PARA
    assert refused(" " * (rank_table.MAX_TABLE_BYTES + 1))[0] == ht.HCCL_E_PARA


def test_a_rank_outside_the_table_or_on_another_device():
    table = rank_table.parse(json.dumps(TABLE))
    with pytest.raises(rank_table.RankTableError) as caught:
        table.entry(2, 0)
    assert caught.value.result == ht.HCCL_E_PARA
    with pytest.raises(rank_table.RankTableError) as caught:
        table.entry(1, 1)
    assert caught.value.result == ht.HCCL_E_UNAVAIL
    assert "rank 1 is on device 0 of server 'node_0'" in caught.value.message


def _two_servers(first_address: str | None, second_address: str | None) -> str:
    table = copy.deepcopy(TABLE)
    second = copy.deepcopy(table["server_list"][0])
    second["server_id"] = "node_1"
    for device, rank in zip(second["device"], ("2", "3")):
        device["rank_id"] = rank
        device["device_ip"] = device["device_ip"].replace("192.168.1.", "192.168.2.")
    table["server_list"].append(second)
    table["server_count"] = "2"
    for server, address in zip(table["server_list"], (first_address, second_address)):
        if address is not None:
            server["simnpu_address"] = address
    return json.dumps(table)


def test_each_servers_daemon_address_comes_from_the_table_or_the_environment():
    table = rank_table.parse(_two_servers("host-a:50151", None))
    assert table.addresses == ("host-a:50151", "")
    assert table.daemon_addresses("node_1=host-b:50151") == ("host-a:50151", "host-b:50151")
    assert table.daemon_addresses(" node_0=[::1]:1 , node_1=b:2 ") == ("[::1]:1", "b:2")
    for overrides, words in [
        ("", "no daemon address for server node_1"),
        ("node_2=host-c:1", "not server_id=host:port"),
        ("node_1", "not server_id=host:port"),
        ("node_1=/tmp/x.sock", "not server_id=host:port"),
        ("node_1=unix:///x.sock", "not server_id=host:port"),
    ]:
        with pytest.raises(rank_table.RankTableError) as caught:
            table.daemon_addresses(overrides)
        assert caught.value.result == ht.HCCL_E_PARA and words in caught.value.message


@pytest.mark.parametrize("address", ["unix:///x.sock", "no-port", "", 7])
def test_a_simnpu_address_that_is_no_host_and_port_is_refused(address):
    result, message = refused(_two_servers(address, "host-b:1"))  # type: ignore[arg-type]
    assert result == ht.HCCL_E_PARA
    assert "simnpu_address" in message
