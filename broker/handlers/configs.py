"""DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44) for topics
and this broker.

A topic config's value comes from, in order: the topic's override
(DYNAMIC_TOPIC_CONFIG), the broker's default for it (STATIC_BROKER_CONFIG,
under the broker property's name, ``log.retention.ms`` for
``retention.ms``), or Kafka's default (DEFAULT_CONFIG); with
``include_synonyms`` all three are listed, most specific first. Broker
configs are read-only: they come from flags and environment variables.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error
from shoal.broker.log.config import TOPIC_CONFIGS, ConfigType
from shoal.broker.topic_admin import AdminError, ConfigOp

TOPIC: Final = 2
BROKER: Final = 4
BROKER_LOGGER: Final = 8

DYNAMIC_TOPIC_CONFIG: Final = 1
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5


@dataclass(frozen=True, slots=True)
class ConfigValue:
    name: str
    value: str
    source: int
    read_only: bool
    type: ConfigType
    doc: str
    synonyms: tuple[tuple[str, str, int], ...]


def topic_config_values(
    overrides: Mapping[str, str], broker_defaults: Mapping[str, str]
) -> list[ConfigValue]:
    """Every topic config with its effective value, source and synonyms."""
    values = []
    for key in TOPIC_CONFIGS.values():
        synonyms: list[tuple[str, str, int]] = []
        if key.name in overrides:
            synonyms.append((key.name, overrides[key.name], DYNAMIC_TOPIC_CONFIG))
        if key.synonym and key.synonym in broker_defaults:
            synonyms.append((key.synonym, broker_defaults[key.synonym], STATIC_BROKER_CONFIG))
        synonyms.append((key.synonym or key.name, key.default, DEFAULT_CONFIG))
        _, value, source = synonyms[0]
        values.append(
            ConfigValue(key.name, value, source, False, key.type, key.doc, tuple(synonyms))
        )
    return values


def _broker_config_values(services: BrokerServices) -> list[ConfigValue]:
    config = services.config
    host, port = config.advertised_address
    static: list[tuple[str, str, ConfigType, str]] = [
        ("node.id", str(services.node_id), ConfigType.INT, "This broker's id."),
        ("log.dirs", str(config.data_dir), ConfigType.STRING, "Where partition logs live."),
        ("advertised.listeners", f"PLAINTEXT://{host}:{port}", ConfigType.LIST, "Client address."),
        ("num.partitions", str(config.num_partitions), ConfigType.INT, "Default partitions."),
        (
            "default.replication.factor",
            str(config.default_replication_factor),
            ConfigType.INT,
            "Default replication factor.",
        ),
        (
            "auto.create.topics.enable",
            str(config.auto_create_topics_enable).lower(),
            ConfigType.BOOLEAN,
            "Whether Metadata requests create unknown topics.",
        ),
        (
            "socket.request.max.bytes",
            str(config.socket_request_max_bytes),
            ConfigType.INT,
            "Largest request accepted.",
        ),
        (
            "log.retention.check.interval.ms",
            str(config.log_retention_check_interval_ms),
            ConfigType.LONG,
            "How often retention runs.",
        ),
        (
            "offsets.retention.minutes",
            str(config.offsets_retention_minutes),
            ConfigType.INT,
            "How long committed offsets of a group without members are kept.",
        ),
        (
            "group.min.session.timeout.ms",
            str(config.group_min_session_timeout_ms),
            ConfigType.INT,
            "Shortest session timeout a group member may ask for.",
        ),
        (
            "group.max.session.timeout.ms",
            str(config.group_max_session_timeout_ms),
            ConfigType.INT,
            "Longest session timeout a group member may ask for.",
        ),
        (
            "transaction.max.timeout.ms",
            str(config.transaction_max_timeout_ms),
            ConfigType.INT,
            "Longest transaction timeout a producer may ask for.",
        ),
    ]
    values = [
        ConfigValue(name, value, STATIC_BROKER_CONFIG, True, kind, doc, ((name, value, 4),))
        for name, value, kind, doc in static
    ]
    defaults = services.replicas.broker_defaults
    for key in TOPIC_CONFIGS.values():
        name = key.synonym or key.name
        if name in {v.name for v in values}:
            continue
        explicit = defaults.get(name)
        value, source = (
            (explicit, STATIC_BROKER_CONFIG) if explicit else (key.default, DEFAULT_CONFIG)
        )
        values.append(
            ConfigValue(name, value, source, True, key.type, key.doc, ((name, value, source),))
        )
    return values


def _describe_entry(ctx: RequestContext, request: Any, value: ConfigValue) -> Any:
    api = ctx.api
    synonyms = (
        tuple(
            api.make("DescribeConfigsSynonym", name=n, value=v, source=s)
            for n, v, s in value.synonyms
        )
        if request.include_synonyms
        else ()
    )
    return api.make(
        "DescribeConfigsResourceResult",
        name=value.name,
        value=value.value,
        read_only=value.read_only,
        config_source=value.source,
        is_sensitive=False,
        synonyms=synonyms,
        config_type=int(value.type),
        documentation=value.doc if getattr(request, "include_documentation", False) else None,
    )


async def handle_describe_configs(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    results = []
    for resource in request.resources:
        code, message, entries = E.none, None, []
        try:
            values = _resource_values(services, resource.resource_type, resource.resource_name)
            keys = resource.configuration_keys
            wanted = [v for v in values if not keys or v.name in keys]
            entries = [_describe_entry(ctx, request, v) for v in wanted]
        except AdminError as exc:
            code, message = error(exc.code), exc.message
        results.append(
            api.make(
                "DescribeConfigsResult",
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=tuple(entries),
            )
        )
    return api.response(throttle_time=NO_THROTTLE, results=tuple(results))


def _resource_values(services: BrokerServices, kind: int, name: str) -> list[ConfigValue]:
    if kind == TOPIC:
        topic = services.topic(name)
        if topic is None:
            raise AdminError("unknown_topic_or_partition", f"Topic '{name}' does not exist.")
        return topic_config_values(topic.record.configs, services.replicas.broker_defaults)
    if kind == BROKER:
        _check_broker_name(services, name)
        return _broker_config_values(services)
    if kind == BROKER_LOGGER:
        raise AdminError("invalid_request", "Broker loggers are not configurable over Kafka.")
    raise AdminError("invalid_request", f"Unknown resource type {kind}.")


def _check_broker_name(services: BrokerServices, name: str) -> None:
    """A broker answers for itself: its id, or "" for the cluster's defaults."""
    if name not in ("", str(services.node_id)):
        raise AdminError(
            "invalid_request", f"Broker {services.node_id} cannot answer for broker {name}."
        )


async def handle_incremental_alter_configs(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    async def apply(resource: Any) -> None:
        if resource.resource_type != TOPIC:
            raise AdminError(
                "invalid_request",
                "Only topic configs can be altered; broker configs come from its flags"
                " and environment.",
            )
        ops = [ConfigOp(c.name, c.config_operation, c.value) for c in resource.configs]
        await services.admin.alter_configs(resource.resource_name, ops, request.validate_only)

    return await _alter_each(ctx, request, apply)


async def handle_alter_configs(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    """Legacy AlterConfigs (33): a resource's dynamic configs become exactly those named.

    A broker has no dynamic configs, so replacing them with none is the only
    change it accepts (and changes nothing); naming any is refused as
    IncrementalAlterConfigs refuses it.
    """

    async def apply(resource: Any) -> None:
        configs = {c.name: c.value for c in resource.configs}
        if resource.resource_type == TOPIC:
            nulls = sorted(name for name, value in configs.items() if value is None)
            if nulls:
                # A null cannot mean "revert": leaving the config out does that.
                raise AdminError(
                    "invalid_request", f"Null value not supported for: {', '.join(nulls)}."
                )
            await services.admin.replace_configs(
                resource.resource_name, configs, request.validate_only
            )
        elif resource.resource_type == BROKER:
            _check_broker_name(services, resource.resource_name)
            if configs:
                raise AdminError(
                    "invalid_request",
                    f"Cannot update these broker configs dynamically: {', '.join(sorted(configs))}."
                    " Broker configs come from its flags and environment.",
                )
        elif resource.resource_type == BROKER_LOGGER:
            raise AdminError("invalid_request", "Broker loggers are not configurable over Kafka.")
        else:
            raise AdminError("invalid_request", f"Unknown resource type {resource.resource_type}.")

    return await _alter_each(ctx, request, apply)


async def _alter_each(
    ctx: RequestContext, request: Any, apply: Callable[[Any], Awaitable[None]]
) -> Any:
    """Apply each resource's change on its own: one refusal leaves the others be."""
    api = ctx.api
    results = []
    for resource in request.resources:
        code, message = E.none, None
        try:
            await apply(resource)
        except AdminError as exc:
            code, message = error(exc.code), exc.message
        results.append(
            api.make(
                "AlterConfigsResourceResponse",
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return api.response(throttle_time=NO_THROTTLE, responses=tuple(results))
