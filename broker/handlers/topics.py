"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37).

Each topic in a request succeeds or fails on its own, with Kafka's error
code and a message; a name that appears twice in one request fails both
times with INVALID_REQUEST, as in Kafka. CreateTopics and CreatePartitions
place replicas, so a broker that is not the controller forwards them to it
(:mod:`shoal.broker.controller.forwarding`).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from shoal.broker.cluster.model import ClusterImage, TopicName
from shoal.broker.controller.forwarding import ForwardingError
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error
from shoal.broker.handlers.configs import topic_config_values
from shoal.broker.topic_admin import AdminError

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)
_SETTLE_S: Final = 10.0


async def _via_controller(
    services: BrokerServices,
    ctx: RequestContext,
    request: Any,
    settled: Callable[[Any], Callable[[ClusterImage], bool]],
) -> Any | None:
    """The controller's answer, once this broker's image shows it; None to decide here."""
    forwarder = services.forwarder
    if forwarder.is_controller():
        return None
    try:
        response = await forwarder.forward(ctx.api, request)
    except ForwardingError as exc:
        log.warning("event=admin_forward_failed api=%d error=%s", ctx.api.api_key, exc)
        return None
    if not request.validate_only:
        await services.cache.wait_until(settled(response), _SETTLE_S)
    return response


def _topics_created(response: Any) -> Callable[[ClusterImage], bool]:
    names = [t.name for t in response.topics if t.error_code is E.none]
    return lambda image: all(TopicName(n) in image.topics for n in names)


def _partitions_created(request: Any, response: Any) -> Callable[[ClusterImage], bool]:
    ok = {r.name for r in response.results if r.error_code is E.none}
    wanted = {t.name: t.count for t in request.topics if t.name in ok}

    def settled(image: ClusterImage) -> bool:
        for name, count in wanted.items():
            topic = image.topics.get(TopicName(name))
            if topic is None or topic.record.partition_count < count:
                return False
        return True

    return settled


def _duplicates(names: list[str]) -> set[str]:
    return {name for name, count in Counter(names).items() if count > 1}


async def handle_create_topics(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    forwarded = await _via_controller(services, ctx, request, _topics_created)
    if forwarded is not None:
        return forwarded
    api = ctx.api
    duplicated = _duplicates([t.name for t in request.topics])
    results = []
    for topic in request.topics:
        try:
            if topic.name in duplicated:
                raise AdminError("invalid_request", f"Topic '{topic.name}' appears twice.")
            record = await services.admin.create(
                topic.name,
                topic.num_partitions,
                topic.replication_factor,
                {a.partition_index: a.broker_ids for a in topic.assignments},
                {c.name: c.value for c in topic.configs},
                request.validate_only,
            )
        except AdminError as exc:
            results.append(
                api.make(
                    "CreatableTopicResult",
                    name=topic.name,
                    topic_id=ZERO_UUID,
                    error_code=error(exc.code),
                    error_message=exc.message,
                    num_partitions=-1,
                    replication_factor=-1,
                    configs=None,
                )
            )
            continue
        configs = None
        if api.has_class("CreatableTopicConfigs"):
            configs = tuple(
                api.make(
                    "CreatableTopicConfigs",
                    name=value.name,
                    value=value.value,
                    read_only=False,
                    config_source=value.source,
                    is_sensitive=False,
                )
                for value in topic_config_values(record.configs, services.replicas.broker_defaults)
            )
        results.append(
            api.make(
                "CreatableTopicResult",
                name=topic.name,
                topic_id=record.topic_id,
                error_code=E.none,
                error_message=None,
                num_partitions=record.partition_count,
                replication_factor=record.replication_factor,
                configs=configs,
            )
        )
    return api.response(throttle_time=NO_THROTTLE, topics=tuple(results))


async def handle_delete_topics(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    image = services.image
    if ctx.version >= 6:
        asked = [(t.name, t.topic_id) for t in request.topics]
    else:
        asked = [(name, None) for name in request.topic_names]
    duplicated = _duplicates([name or str(topic_id) for name, topic_id in asked])
    results = []
    for name, asked_id in asked:
        code, message = E.none, None
        resolved, topic_id = name, asked_id
        if asked_id is not None and asked_id != ZERO_UUID:
            resolved = image.topic_ids.get(asked_id)
        try:
            if (name or str(asked_id)) in duplicated:
                raise AdminError("invalid_request", "The topic appears twice in the request.")
            if resolved is None:
                raise AdminError("unknown_topic_id", f"Topic id {asked_id} does not exist.")
            topic_id = await services.admin.delete(resolved)
        except AdminError as exc:
            code, message = error(exc.code), exc.message
        results.append(
            api.make(
                "DeletableTopicResult",
                name=resolved,
                topic_id=topic_id or ZERO_UUID,
                error_code=code,
                error_message=message,
            )
        )
    return api.response(throttle_time=NO_THROTTLE, responses=tuple(results))


async def handle_create_partitions(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    forwarded = await _via_controller(
        services, ctx, request, lambda response: _partitions_created(request, response)
    )
    if forwarded is not None:
        return forwarded
    api = ctx.api
    duplicated = _duplicates([t.name for t in request.topics])
    results = []
    for topic in request.topics:
        code, message = E.none, None
        try:
            if topic.name in duplicated:
                raise AdminError("invalid_request", f"Topic '{topic.name}' appears twice.")
            assignment = [a.broker_ids for a in topic.assignments] if topic.assignments else None
            await services.admin.create_partitions(
                topic.name, topic.count, assignment, request.validate_only
            )
        except AdminError as exc:
            code, message = error(exc.code), exc.message
        results.append(
            api.make(
                "CreatePartitionsTopicResult",
                name=topic.name,
                error_code=code,
                error_message=message,
            )
        )
    return api.response(throttle_time=NO_THROTTLE, results=tuple(results))
