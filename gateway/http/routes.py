"""The Kafka-backed routes under ``/v3/clusters``: topics, configs, records, groups.

Thin: each route takes the :data:`~shoal.gateway.http.auth.Caller`, builds
the caller's :class:`~shoal.gateway.tenant_client.TenantClient`, checks the
cluster id in the path, and delegates to a controller
(:mod:`~shoal.gateway.http.topics`, :mod:`~shoal.gateway.http.records`,
:mod:`~shoal.gateway.http.groups`). Kafka errors raised on the way become
JSON errors through :data:`EXCEPTION_HANDLERS`, which ``create_app``
registers.

The cluster id is the brokers' own (Metadata's ``cluster_id``); every tenant
sees the same one, as every Kafka client of the cluster does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from shoal.gateway.http.auth import Caller
from shoal.gateway.http.encoding import ReadFormat
from shoal.gateway.http.errors import (
    COMMON_ERRORS,
    ApiError,
    ErrorBody,
    ErrorCode,
    error_response,
    kafka_error,
)
from shoal.gateway.http.groups import GroupsController
from shoal.gateway.http.models import (
    GROUP_ID_PATTERN,
    PRODUCE_BATCH_RESULT,
    PRODUCE_RESULT,
    TOPIC_NAME_PATTERN,
    AlterConfigs,
    Cluster,
    ClusterList,
    ConsumerGroup,
    ConsumerGroupLagSummary,
    ConsumerGroupList,
    ConsumerLagList,
    CreateTopic,
    PartitionId,
    PartitionList,
    ProduceBatch,
    ProduceBatchFailure,
    ProduceBatchResult,
    ProduceBatchSuccess,
    ProduceRecord,
    ProduceResult,
    QuotaRefusal,
    ReadRecords,
    SetConfig,
    Topic,
    TopicConfig,
    TopicConfigList,
    TopicList,
    UpdateTopic,
)
from shoal.gateway.http.records import OK, RecordsController, single_record
from shoal.gateway.http.topics import TopicsController
from shoal.gateway.tenant_client import KafkaCallError, QuotaExceededError, TenantClient
from shoal.gateway.upstream import UpstreamError
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

MAX_PRODUCE_BODY_BYTES: Final = 64 * 2**20
STREAM_MAX_BODY_BYTES: Final = 2**40
"""A streamed produce request's records are read and checked one at a time as
they arrive, so its total is not the app's whole-body bound; this one only
keeps a counter from running forever."""
BODY_SLICE_BYTES: Final = 2**20
"""A buffered body of several records is fed to the stream parser in slices of
this size, the event loop free between them, as a chunked body is."""
"""The largest produce body read whole; longer streams go chunked."""
NDJSON: Final = "application/x-ndjson"


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    **COMMON_ERRORS,
    404: _error("The cluster, topic, partition, group or config does not exist for the caller."),
    409: _error("The topic already exists."),
    413: _error("The record or body is too large."),
    429: _error("The tenant is over its byte-rate quota; see Retry-After."),
    503: _error("The brokers are unreachable or a partition's leader is moving; retry."),
}

router = APIRouter(prefix="/v3/clusters", responses=ERRORS)


async def tenant_client(request: Request, caller: Caller) -> TenantClient:
    state = request.app.state
    if state.lookups is None:
        raise ApiError(ErrorCode.UNAVAILABLE, "this gateway serves no Kafka routes")
    return TenantClient(
        state.services, caller, state.lookups, state.broker_pool, state.home_brokers
    )


Client = Annotated[TenantClient, Depends(tenant_client)]


async def checked_cluster(cluster_id: Annotated[str, Path(max_length=64)], client: Client) -> str:
    actual = await client.cluster_id()
    if cluster_id != actual:
        raise ApiError(ErrorCode.CLUSTER_NOT_FOUND, f"no cluster {cluster_id!r}")
    return actual


ClusterId = Annotated[str, Depends(checked_cluster)]
TopicName = Annotated[str, Path(pattern=TOPIC_NAME_PATTERN)]
GroupId = Annotated[str, Path(pattern=GROUP_ID_PATTERN)]
ConfigName = Annotated[str, Path(min_length=1, max_length=255)]


class _BodyStillOpen(StreamingResponse):
    """A streamed answer written while the request body is still being read.

    Starlette's StreamingResponse reads the request channel itself to notice
    a disconnect (before ASGI 2.4), which would swallow the body the
    streamed produce is reading; this one leaves the channel to the route.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.stream_response(send)


# -- clusters ------------------------------------------------------------------------


@router.get("", tags=["clusters"], summary="The cluster the caller's topics live on")
async def list_clusters(client: Client) -> ClusterList:
    return ClusterList(data=[Cluster(cluster_id=await client.cluster_id())])


@router.get("/{cluster_id}", tags=["clusters"], summary="One cluster")
async def get_cluster(cluster_id: ClusterId) -> Cluster:
    return Cluster(cluster_id=cluster_id)


# -- topics --------------------------------------------------------------------------


@router.get("/{cluster_id}/topics", tags=["topics"], summary="The caller's topics")
async def list_topics(cluster_id: ClusterId, client: Client) -> TopicList:
    return await TopicsController(client, cluster_id).list_topics()


@router.post("/{cluster_id}/topics", tags=["topics"], status_code=201, summary="Create a topic")
async def create_topic(cluster_id: ClusterId, client: Client, body: CreateTopic) -> Topic:
    return await TopicsController(client, cluster_id).create(body)


@router.get("/{cluster_id}/topics/{topic_name}", tags=["topics"], summary="One topic")
async def get_topic(cluster_id: ClusterId, client: Client, topic_name: TopicName) -> Topic:
    return await TopicsController(client, cluster_id).get(topic_name)


@router.patch(
    "/{cluster_id}/topics/{topic_name}",
    tags=["topics"],
    summary="Grow a topic's partitions (Shoal extension)",
)
async def update_topic(
    cluster_id: ClusterId, client: Client, topic_name: TopicName, body: UpdateTopic
) -> Topic:
    return await TopicsController(client, cluster_id).grow(topic_name, body.partitions_count)


@router.delete(
    "/{cluster_id}/topics/{topic_name}", tags=["topics"], status_code=204, summary="Delete a topic"
)
async def delete_topic(cluster_id: ClusterId, client: Client, topic_name: TopicName) -> Response:
    await TopicsController(client, cluster_id).delete(topic_name)
    return Response(status_code=204)


@router.get(
    "/{cluster_id}/topics/{topic_name}/partitions", tags=["topics"], summary="A topic's partitions"
)
async def list_partitions(
    cluster_id: ClusterId, client: Client, topic_name: TopicName
) -> PartitionList:
    return await TopicsController(client, cluster_id).partitions(topic_name)


@router.get(
    "/{cluster_id}/topics/{topic_name}/configs", tags=["configs"], summary="A topic's configs"
)
async def list_configs(
    cluster_id: ClusterId, client: Client, topic_name: TopicName
) -> TopicConfigList:
    return await TopicsController(client, cluster_id).configs(topic_name)


@router.post(
    "/{cluster_id}/topics/{topic_name}/configs:alter",
    tags=["configs"],
    status_code=204,
    summary="Set or reset several configs at once",
)
async def alter_configs(
    cluster_id: ClusterId, client: Client, topic_name: TopicName, body: AlterConfigs
) -> Response:
    await TopicsController(client, cluster_id).alter_configs(topic_name, body)
    return Response(status_code=204)


@router.get(
    "/{cluster_id}/topics/{topic_name}/configs/{name}", tags=["configs"], summary="One config"
)
async def get_config(
    cluster_id: ClusterId, client: Client, topic_name: TopicName, name: ConfigName
) -> TopicConfig:
    return await TopicsController(client, cluster_id).config(topic_name, name)


@router.put(
    "/{cluster_id}/topics/{topic_name}/configs/{name}",
    tags=["configs"],
    status_code=204,
    summary="Set one config",
)
async def set_config(
    cluster_id: ClusterId, client: Client, topic_name: TopicName, name: ConfigName, body: SetConfig
) -> Response:
    await TopicsController(client, cluster_id).set_config(topic_name, name, body.value)
    return Response(status_code=204)


@router.delete(
    "/{cluster_id}/topics/{topic_name}/configs/{name}",
    tags=["configs"],
    status_code=204,
    summary="Reset one config to its default",
)
async def reset_config(
    cluster_id: ClusterId, client: Client, topic_name: TopicName, name: ConfigName
) -> Response:
    await TopicsController(client, cluster_id).reset_config(topic_name, name)
    return Response(status_code=204)


# -- records -------------------------------------------------------------------------

_PRODUCE_DESCRIPTION = """\
One record as a JSON object, answered with its delivery report.

**Streaming**: send several objects one after another (concatenated or one per
line). With a chunked body (no Content-Length) records are produced as they
arrive and reports stream back as they are stored; either way the answer is
`application/x-ndjson`, one report per record in order, each with its own
`error_code` (200 when stored).
"""


RAW_BODIES: Final = (ProduceRecord, ProduceBatch)
"""Request bodies the routes parse themselves, on the raw bytes (a record stream is
several objects; a batch parsed by FastAPI, through Python objects, took twice as
long): ``build_api`` adds their schemas to the document, which FastAPI cannot."""


async def _json_body(request: Request) -> bytes:
    """The whole body of a JSON request, as FastAPI reads the bodies it parses: before
    authentication (a dependency declared before the caller's), within the router's
    bound, refused unless sent as JSON (a form post from a browser that has the
    caller's Basic credentials must not produce), a client gone mid-body a 400."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise ApiError(ErrorCode.INVALID_INPUT, "send the body as Content-Type: application/json")
    try:
        return await request.body()
    except ClientDisconnect:
        raise ApiError(ErrorCode.BAD_REQUEST, "the body ended before its end") from None


JsonBody = Annotated[bytes, Depends(_json_body)]


def _documented_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


@router.post(
    "/{cluster_id}/topics/{topic_name}/records",
    max_body_size=STREAM_MAX_BODY_BYTES,
    tags=["records"],
    summary="Produce a record, or a stream of records",
    description=_PRODUCE_DESCRIPTION,
    response_model=None,
    responses={
        200: {
            "model": ProduceResult,
            "description": "The record's delivery report (one per line when streaming).",
            "content": {NDJSON: {"schema": {"$ref": "#/components/schemas/ProduceResult"}}},
        },
        **ERRORS,
    },
    openapi_extra=_documented_body(ProduceRecord),
)
async def produce(
    request: Request, cluster_id: ClusterId, client: Client, topic_name: TopicName
) -> Response:
    controller = RecordsController(client, cluster_id, await client.topic(topic_name))
    length = request.headers.get("content-length")
    if length is None:
        return _BodyStillOpen(controller.produce_stream(request.stream()), media_type=NDJSON)
    if not length.isdigit() or int(length) > MAX_PRODUCE_BODY_BYTES:
        raise ApiError(
            ErrorCode.RECORD_TOO_LARGE,
            f"a body over {MAX_PRODUCE_BODY_BYTES} bytes must be streamed (chunked)",
        )
    body = await request.body()
    if not body.strip():
        raise ApiError(ErrorCode.INVALID_INPUT, "the body holds no record")
    # One large object takes a while to parse: off the event loop. (A body of
    # several objects stops parsing at the end of the first.)
    if len(body) > BODY_SLICE_BYTES:
        single = await asyncio.to_thread(single_record, body)
    else:
        single = single_record(body)
    if single is None:
        return _BodyStillOpen(controller.produce_stream(_slices(body)), media_type=NDJSON)
    [result] = await controller.produce([single])
    if result.error_code != OK:
        message = result.message or ""
        if result.kafka_error and result.kafka_error not in message:
            message = f"{result.kafka_error}: {message}"
        headers = None
        if isinstance(result, QuotaRefusal):
            headers = {"Retry-After": _retry_after(result.retry_after_ms)}
        raise ApiError(ErrorCode(result.error_code), message, headers)
    return Response(PRODUCE_RESULT.dump_json(result), media_type="application/json")


async def _slices(body: bytes) -> AsyncIterator[bytes]:
    """A buffered body as chunks of BODY_SLICE_BYTES, yielding to the loop between them."""
    for start in range(0, len(body), BODY_SLICE_BYTES):
        if start:
            await asyncio.sleep(0)
        yield body[start : start + BODY_SLICE_BYTES]


@router.post(
    "/{cluster_id}/topics/{topic_name}/records:batch",
    tags=["records"],
    status_code=207,
    summary="Produce a batch of records, each with an id",
    response_model=ProduceBatchResult,
    openapi_extra=_documented_body(ProduceBatch),
)
async def produce_batch(
    raw: JsonBody, cluster_id: ClusterId, client: Client, topic_name: TopicName
) -> Response:
    body = _parsed_batch(raw)
    ids = [entry.id for entry in body.entries]
    if len(set(ids)) != len(ids):
        raise ApiError(ErrorCode.INVALID_INPUT, "entry ids must be unique within a batch")
    controller = RecordsController(client, cluster_id, await client.topic(topic_name))
    results = await controller.produce(body.entries)
    answer = ProduceBatchResult(successes=[], failures=[])
    for entry, result in zip(body.entries, results, strict=True):
        if result.error_code == OK:
            answer.successes.append(ProduceBatchSuccess.of(entry.id, result))
        else:
            answer.failures.append(
                ProduceBatchFailure(
                    id=entry.id,
                    error_code=result.error_code,
                    message=result.message or "",
                    kafka_error=result.kafka_error,
                )
            )
    return Response(
        PRODUCE_BATCH_RESULT.dump_json(answer), status_code=207, media_type="application/json"
    )


def _parsed_batch(body: bytes) -> ProduceBatch:
    """The batch in ``body``; its problems in the shape of FastAPI's answer to a body's."""
    if not body.strip():
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        return ProduceBatch.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


@router.get(
    "/{cluster_id}/topics/{topic_name}/partitions/{partition_id}/records",
    tags=["records"],
    summary="Read records from a partition (Shoal extension)",
    responses={
        416: _error("The offset is past the partition's end or before its start."),
        422: _error("A key or value does not decode in the asked format."),
    },
)
async def read_records(
    cluster_id: ClusterId,
    client: Client,
    topic_name: TopicName,
    partition_id: Annotated[PartitionId, Path()],
    offset: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="First offset; default: the start.")
    ] = None,
    timestamp: Annotated[
        datetime | None, Query(description="Start at the first record at or after this time.")
    ] = None,
    max_records: Annotated[int, Query(ge=1, le=10000)] = 100,
    max_bytes: Annotated[int, Query(ge=1, le=64 * 2**20)] = 2**20,
    format: Annotated[
        ReadFormat, Query(description="How keys and values are shown.")
    ] = ReadFormat.BINARY,
) -> ReadRecords:
    if offset is not None and timestamp is not None:
        raise ApiError(ErrorCode.INVALID_INPUT, "give offset or timestamp, not both")
    controller = RecordsController(client, cluster_id, await client.topic(topic_name))
    return await controller.read(partition_id, offset, timestamp, max_records, max_bytes, format)


# -- consumer groups -------------------------------------------------------------------


@router.get(
    "/{cluster_id}/consumer-groups", tags=["consumer groups"], summary="The caller's groups"
)
async def list_groups(cluster_id: ClusterId, client: Client) -> ConsumerGroupList:
    return await GroupsController(client, cluster_id).list_groups()


@router.get(
    "/{cluster_id}/consumer-groups/{consumer_group_id}",
    tags=["consumer groups"],
    summary="One group: state, coordinator, members",
)
async def get_group(
    cluster_id: ClusterId, client: Client, consumer_group_id: GroupId
) -> ConsumerGroup:
    return await GroupsController(client, cluster_id).get(consumer_group_id)


@router.get(
    "/{cluster_id}/consumer-groups/{consumer_group_id}/lags",
    tags=["consumer groups"],
    summary="A group's lag per partition",
)
async def group_lags(
    cluster_id: ClusterId, client: Client, consumer_group_id: GroupId
) -> ConsumerLagList:
    return await GroupsController(client, cluster_id).lags(consumer_group_id)


@router.get(
    "/{cluster_id}/consumer-groups/{consumer_group_id}/lag-summary",
    tags=["consumer groups"],
    summary="A group's largest and total lag",
)
async def group_lag_summary(
    cluster_id: ClusterId, client: Client, consumer_group_id: GroupId
) -> ConsumerGroupLagSummary:
    return await GroupsController(client, cluster_id).lag_summary(consumer_group_id)


# -- errors on the way -------------------------------------------------------------------


async def _kafka_call_error(request: Request, exc: Exception) -> JSONResponse:
    del request
    assert isinstance(exc, KafkaCallError)
    error = kafka_error(exc.code, exc.message)
    return error_response(error.code, error.message)


async def _quota_exceeded(request: Request, exc: Exception) -> JSONResponse:
    del request
    assert isinstance(exc, QuotaExceededError)
    return error_response(
        ErrorCode.TOO_MANY_REQUESTS,
        str(exc),
        headers={"Retry-After": _retry_after(exc.retry_after_ms)},
    )


def _retry_after(wait_ms: int) -> str:
    """Retry-After counts whole seconds: at least one, so a client does wait."""
    return str(max(1, math.ceil(wait_ms / 1000)))


async def _upstream_error(request: Request, exc: Exception) -> JSONResponse:
    del request
    return error_response(ErrorCode.UNAVAILABLE, f"the brokers are unreachable: {exc}")


EXCEPTION_HANDLERS: Final[
    dict[type[Exception], Callable[[Request, Exception], Coroutine[Any, Any, JSONResponse]]]
] = {
    KafkaCallError: _kafka_call_error,
    QuotaExceededError: _quota_exceeded,
    UpstreamError: _upstream_error,
}
