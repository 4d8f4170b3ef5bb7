"""The HTTP door keeps a tenant's admin and metadata calls on one broker, so reads see writes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from shoal.gateway.access import TenantAccess
from shoal.gateway.cluster_view import BrokerAddress
from shoal.gateway.tenant_client import HomeBrokers, TenantClient
from shoal.gateway.upstream import UpstreamError
from shoal.tenancy.model import Quotas

BROKERS = [BrokerAddress(n, "127.0.0.1", 9000 + n) for n in (2, 0, 1)]


def ids(brokers: list[BrokerAddress]) -> list[int]:
    return [b.node_id for b in brokers]


def test_a_tenant_without_a_home_takes_the_brokers_in_the_order_given() -> None:
    assert ids(HomeBrokers().order("acme", BROKERS)) == [2, 0, 1]


def test_the_broker_that_last_answered_comes_first_and_the_rest_keep_their_order() -> None:
    homes = HomeBrokers()
    homes.answered("acme", 1)
    assert ids(homes.order("acme", BROKERS)) == [1, 2, 0]
    homes.answered("acme", 0)
    assert ids(homes.order("acme", BROKERS)) == [0, 2, 1]


def test_each_tenant_has_its_own_home() -> None:
    homes = HomeBrokers()
    homes.answered("acme", 1)
    homes.answered("globex", 0)
    assert ids(homes.order("acme", BROKERS))[0] == 1
    assert ids(homes.order("globex", BROKERS))[0] == 0
    assert ids(homes.order("initech", BROKERS)) == [2, 0, 1]


def test_a_home_that_left_the_cluster_is_passed_over() -> None:
    homes = HomeBrokers()
    homes.answered("acme", 7)
    assert ids(homes.order("acme", BROKERS)) == [2, 0, 1]


class Brokers:
    """The gateway's view of the cluster and its connection pool, for routing alone:
    every broker answers except those marked down."""

    def __init__(self) -> None:
        self.down: set[int] = set()
        self.called: list[int] = []

    def bootstrap_candidates(self) -> list[BrokerAddress]:
        return list(BROKERS)

    async def call(self, broker: BrokerAddress, api: Any, body: Any) -> str:
        self.called.append(broker.node_id)
        if broker.node_id in self.down:
            raise UpstreamError(f"broker {broker.node_id} is down")
        return f"answer from {broker.node_id}"


def client(brokers: Brokers, homes: HomeBrokers, tenant: str) -> TenantClient:
    access = TenantAccess(tenant=tenant, key_id="K", bindings=(), quotas=Quotas())
    services = cast(Any, SimpleNamespace(cluster=brokers))
    return TenantClient(services, access, cast(Any, None), cast(Any, brokers), homes)


async def test_calls_stay_on_the_broker_that_answered_and_move_only_when_it_fails() -> None:
    brokers, homes = Brokers(), HomeBrokers()
    acme = client(brokers, homes, "acme")
    brokers.down = {2}
    assert await acme._call_any(cast(Any, None), None) == "answer from 0"
    brokers.down = set()
    for _ in range(3):
        assert await acme._call_any(cast(Any, None), None) == "answer from 0"
    brokers.down = {0}
    assert await acme._call_any(cast(Any, None), None) == "answer from 2"
    assert brokers.called == [2, 0, 0, 0, 0, 0, 2]


async def test_no_broker_answering_is_an_upstream_error_naming_each() -> None:
    brokers = Brokers()
    brokers.down = {0, 1, 2}
    with pytest.raises(UpstreamError, match=r"broker 2 is down.*broker 0 is down.*broker 1"):
        await client(brokers, HomeBrokers(), "acme")._call_any(cast(Any, None), None)
