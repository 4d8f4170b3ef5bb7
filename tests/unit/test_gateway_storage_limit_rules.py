"""The storage limit's decision (shoal.gateway.storage_limit), without brokers.

What a tenant must be able to rely on: it is refused only once a survey has
seen its leader replicas at or past its limit, the message speaks its own
name, the limit's name and the ways out, a neighbour is never judged by its
bytes, and a survey some broker did not answer never frees a full tenant.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from shoal.gateway.namespace import Namespace
from shoal.gateway.storage import Survey, tenant_storage
from shoal.gateway.storage_limit import (
    StorageLimits,
    human_bytes,
    limited_usage,
    storage_refusal,
)
from shoal.gateway.upstream import UpstreamError
from shoal.tenancy.model import Quotas, Tenant


def survey(sizes: Mapping[int, Mapping[tuple[str, int], int]], complete: bool = True) -> Survey:
    """acme.orders has partitions 0 (led by broker 1) and 1 (led by 2); globex.logs one."""
    leaders = {("acme.orders", 0): 1, ("acme.orders", 1): 2, ("globex.logs", 0): 1}
    return Survey(0.0, leaders, sizes, complete)


REPLICATED = survey(
    {
        1: {("acme.orders", 0): 120_000, ("acme.orders", 1): 90_000, ("globex.logs", 0): 5},
        2: {("acme.orders", 0): 120_000, ("acme.orders", 1): 90_000},
    }
)


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (200_000, "200 KB"),
        (10_240_000, "10.2 MB"),
        (10_000_000, "10 MB"),
        (10_737_418_240, "10.7 GB"),
    ],
)
def test_sizes_are_written_for_people(count: int, text: str) -> None:
    assert human_bytes(count) == text


def test_a_tenant_under_its_limit_or_without_one_or_not_yet_surveyed_may_produce() -> None:
    assert storage_refusal("acme", 199_999, 200_000) is None
    assert storage_refusal("acme", 10**12, None) is None
    assert storage_refusal("acme", None, 200_000) is None


def test_at_the_limit_the_refusal_names_the_tenant_the_limit_and_the_ways_out() -> None:
    message = storage_refusal("acme", 10_240_000, 10_000_000)

    assert message == (
        "tenant acme stores 10.2 MB, its limit (maxStorageBytes) is 10 MB: delete records"
        " or topics, shorten retention, or ask for a higher limit"
    )
    assert storage_refusal("acme", 200_000, 200_000) is not None


def test_a_tenants_storage_counts_each_partitions_leader_once() -> None:
    # Two replicas of 210 KB: the tenant's data takes 210 KB once.
    assert limited_usage(REPLICATED, {"acme": 200_000}) == {"acme": 210_000}


def test_the_limit_counts_what_the_usage_route_shows() -> None:
    names = {"acme": 1, "globex": 1, "acm": 1, "initech": 1}
    usage = limited_usage(REPLICATED, names)
    assert usage == {
        tenant: tenant_storage(REPLICATED, Namespace(tenant)).leader_bytes for tenant in names
    }
    assert usage == {"acme": 210_000, "globex": 5, "acm": 0, "initech": 0}


class StubSurveyor:
    def __init__(self, *answers: Survey | Exception) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def survey(self) -> Survey:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def limits_over(surveyor: StubSurveyor, tenants: dict[str, Tenant]) -> StorageLimits:
    return StorageLimits(surveyor, lambda: tenants)  # type: ignore[arg-type]


def tenant(name: str, limit: int | None) -> Tenant:
    return Tenant(name, 0, Quotas(max_storage_bytes=limit))


async def test_only_limited_tenants_are_watched_and_a_neighbour_is_free() -> None:
    tenants = {"acme": tenant("acme", 200_000), "globex": tenant("globex", None)}
    limits = limits_over(StubSurveyor(REPLICATED), tenants)

    await limits.refresh()

    assert limits.stored == {"acme": 210_000}
    assert limits.refusal("acme", 200_000) is not None
    assert limits.refusal("globex", None) is None


async def test_no_survey_is_taken_while_no_tenant_has_the_limit() -> None:
    surveyor = StubSurveyor()
    limits = limits_over(surveyor, {"acme": tenant("acme", None)})

    await limits.refresh()

    assert surveyor.asked == 0
    assert limits.stored == {}


async def test_deleting_records_frees_the_tenant_at_the_next_survey() -> None:
    emptied = survey({1: {("acme.orders", 0): 0}, 2: {("acme.orders", 1): 0}})
    limits = limits_over(StubSurveyor(REPLICATED, emptied), {"acme": tenant("acme", 200_000)})

    await limits.refresh()
    assert limits.refusal("acme", 200_000) is not None
    await limits.refresh()

    assert limits.refusal("acme", 200_000) is None


async def test_an_incomplete_or_failed_survey_keeps_the_last_figures() -> None:
    # Broker 2 is not answering: acme's partition 1 would vanish from the count.
    partial = survey({1: {("acme.orders", 0): 0}}, complete=False)
    surveyor = StubSurveyor(REPLICATED, partial, UpstreamError("no broker answered"))
    limits = limits_over(surveyor, {"acme": tenant("acme", 200_000)})

    for _ in range(3):
        await limits.refresh()

    assert limits.stored == {"acme": 210_000}
    assert surveyor.asked == 3
