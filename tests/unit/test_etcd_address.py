"""Where etcd is, as every component parses it, and the gRPC target made of it."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aetcd.exceptions
import pytest

from shoal.etcd_address import EtcdAddress
from shoal.etcd_client import grpc_target


def test_one_endpoint_with_the_default_chroot() -> None:
    address = EtcdAddress.parse("http://etcd:2379")
    assert address.endpoints == (("etcd", 2379),)
    assert address.root == "/shoal"
    assert (address.host, address.port) == ("etcd", 2379)


def test_every_member_of_a_cluster_with_the_chroot_after_the_last() -> None:
    address = EtcdAddress.parse("http://10.0.0.1:2379,http://10.0.0.2:2379,10.0.0.3/tenant-a")
    assert address.endpoints == (("10.0.0.1", 2379), ("10.0.0.2", 2379), ("10.0.0.3", 2379))
    assert address.root == "/tenant-a"
    assert str(address) == "10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379"


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("https://etcd:2379", "only http://"),
        ("http://:2379", "no host"),
        ("http://a:2379/one,http://b:2379/two", "two chroots"),
        (" , ", "no endpoint"),
    ],
)
def test_a_url_that_names_no_usable_cluster_is_refused(url: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        EtcdAddress.parse(url)


def fake_dns(host: str, port: object, *args: object, **kwargs: object) -> list[Any]:
    """A resolver that knows ``etcd-N.local`` (10.0.0.N) and nothing else."""
    if host.startswith("etcd-") and host.endswith(".local"):
        address = f"10.0.0.{host[5:-6]}"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.fixture(autouse=True)
def dns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", fake_dns)


def test_one_name_is_left_to_grpcs_resolver_and_several_become_one_address_list() -> None:
    one = EtcdAddress.parse("http://shoal-etcd:2379")
    several = EtcdAddress.parse("http://127.0.0.1:2379,etcd-2.local:2479")
    assert asyncio.run(grpc_target(one)) == "shoal-etcd:2379"
    assert asyncio.run(grpc_target(several)) == "ipv4:127.0.0.1:2379,10.0.0.2:2479"


def test_several_members_are_ipv4_only() -> None:
    with pytest.raises(aetcd.exceptions.ConnectionFailedError, match="IPv4"):
        asyncio.run(grpc_target(EtcdAddress.parse("http://[::1]:2379,http://[::2]:2379")))


def test_a_member_not_in_dns_is_left_out_and_none_at_all_is_an_error() -> None:
    some = EtcdAddress.parse("http://127.0.0.1:2379,no-such-member.invalid:2379")
    none = EtcdAddress.parse("http://a.invalid:2379,b.invalid:2379")
    assert asyncio.run(grpc_target(some)) == "ipv4:127.0.0.1:2379"
    with pytest.raises(aetcd.exceptions.ConnectionFailedError, match="no etcd member"):
        asyncio.run(grpc_target(none))
