"""The gateway never forwards the APIs that operate the cluster itself.

Tenants share the brokers: moving replicas (AlterPartitionReassignments,
ListPartitionReassignments), changing ISRs (AlterPartition) or reading the
brokers' disks (DescribeLogDirs) would reach past every tenant's namespace.
An API missing from the gateway's tables is not offered in ApiVersions and
closes the connection when sent anyway.
"""

from __future__ import annotations

import pytest
from shoal.broker.handlers import API_VERSIONS as BROKER_APIS
from shoal.gateway.apis import GATEWAY_ONLY, REWRITERS

OPERATOR_ONLY = {
    35: "DescribeLogDirs",
    45: "AlterPartitionReassignments",
    46: "ListPartitionReassignments",
    56: "AlterPartition",
}


@pytest.mark.parametrize("api_key", sorted(OPERATOR_ONLY), ids=OPERATOR_ONLY.get)
def test_brokers_serve_it_but_tenants_cannot_reach_it(api_key: int) -> None:
    assert api_key in BROKER_APIS
    assert api_key not in REWRITERS
    assert api_key not in GATEWAY_ONLY
