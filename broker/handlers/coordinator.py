"""FindCoordinator (10): no coordinator yet, said the way Kafka says it.

Group and transaction coordinators arrive with the consumer-groups and
transactions issues. Until then every lookup answers COORDINATOR_NOT_AVAILABLE,
which is what a Kafka broker answers while its coordinators are loading:
clients retry instead of failing or hanging. Serving the API at all also
matters to librdkafka, which enables lz4 only for brokers that list it.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

KEY_TYPES: Final = {0: "group", 1: "transaction"}
_NOT_YET: Final = "Shoal does not run {kind} coordinators yet."


def _lookup(key_type: int) -> tuple[Any, str]:
    kind = KEY_TYPES.get(key_type)
    if kind is None:
        return E.invalid_request, f"Unknown coordinator key type {key_type}."
    return E.coordinator_not_available, _NOT_YET.format(kind=kind)


async def handle_find_coordinator(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    key_type = getattr(request, "key_type", 0)
    code, message = _lookup(key_type)
    if ctx.version >= 4:
        coordinators = tuple(
            api.make(
                "Coordinator",
                key=key,
                node_id=-1,
                host="",
                port=-1,
                error_code=code,
                error_message=message,
            )
            for key in request.coordinator_keys
        )
        return api.response(throttle_time=NO_THROTTLE, coordinators=coordinators)
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=code,
        error_message=message,
        node_id=-1,
        host="",
        port=-1,
    )
