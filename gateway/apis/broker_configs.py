"""The broker configs a tenant may read, and the filter that keeps it to them.

A tenant's clients ask the brokers' configs to learn the limits they work
within: the largest batch (``message.max.bytes``), the defaults a CreateTopics
without settings gets, the session and transaction timeouts they may ask for,
how long idle groups keep their offsets. Those answers are the same for every
tenant and say nothing of the platform. Everything else a broker reports
(its addresses and listeners, data paths, replication and cleaner tuning) is
the platform's and is never shown: the filter is a list of names allowed, so
a config the brokers add later stays hidden until it is added here.

Values, sources, synonyms and flags are the broker's own, as it reports them;
only whole entries (and synonyms naming hidden configs) are left out.
docs/gateway.md lists the same names for tenants.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.gateway.apis.base import replace

TENANT_BROKER_CONFIGS: Final = frozenset(
    {
        "auto.create.topics.enable",
        "compression.type",
        "default.replication.factor",
        "group.max.session.timeout.ms",
        "group.min.session.timeout.ms",
        "log.retention.bytes",
        "log.retention.ms",
        "message.max.bytes",
        "min.insync.replicas",
        "num.partitions",
        "offsets.retention.minutes",
        "transaction.max.timeout.ms",
    }
)
"""Broker configs a tenant with DESCRIBE_CONFIGS on its cluster may read."""


def tenant_view(result: Any) -> Any:
    """A DescribeConfigs result for a broker, cut down to :data:`TENANT_BROKER_CONFIGS`."""
    configs = tuple(
        replace(
            entry,
            synonyms=tuple(s for s in entry.synonyms if s.name in TENANT_BROKER_CONFIGS),
        )
        for entry in result.configs
        if entry.name in TENANT_BROKER_CONFIGS
    )
    return replace(result, configs=configs)
