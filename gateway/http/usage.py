"""``/v3/usage``: what the caller's tenant has moved through this gateway and stores.

Traffic counters come from the gateway's :class:`~shoal.gateway.usage.UsageLedger`:
this gateway process only, since it started (a restart begins again at
zero; with several gateways, add their answers, or read Prometheus).
Storage is cluster-wide, from the brokers' DescribeLogDirs, refreshed at most
every few seconds (:mod:`shoal.gateway.storage`). Per-topic storage lists only
topics the key may DESCRIBE, as the Kafka door's Metadata does; the totals
count every topic of the tenant, since they are the tenant's bill.

Reading usage needs DESCRIBE on the cluster (default and read-only keys have it).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from shoal.gateway.http.auth import Caller
from shoal.gateway.http.errors import COMMON_ERRORS, ApiError, ErrorBody, ErrorCode
from shoal.gateway.storage import StorageSurveyor, tenant_storage
from shoal.gateway.upstream import UpstreamError
from shoal.tenancy.model import Operation

router = APIRouter(prefix="/v3/usage", tags=["usage"])


class TopicStorageInfo(BaseModel):
    topic: str
    leader_bytes: int = Field(description="Bytes of the topic's partitions, one copy each.")
    replica_bytes: int = Field(description="Bytes on disk over every replica.")


class StorageInfo(BaseModel):
    leader_bytes: int = Field(description="Bytes retained by the tenant's topics, one copy.")
    replica_bytes: int = Field(description="Bytes retained over every replica.")
    measured_at: datetime = Field(description="When the brokers were asked (cached briefly).")
    complete: bool = Field(description="False if a broker did not answer: sizes are then low.")
    topics: list[TopicStorageInfo]


class Usage(BaseModel):
    tenant: str
    bytes_in: int = Field(description="Produced bytes through this gateway since it started.")
    bytes_out: int = Field(description="Fetched bytes through this gateway since it started.")
    produce_requests: int = Field(description="Produce requests through this gateway.")
    fetch_requests: int = Field(description="Fetch requests through this gateway.")
    throttle_ms: int = Field(description="Quota throttle time given by this gateway, in ms.")
    storage: StorageInfo


@router.get(
    "",
    summary="The tenant's traffic through this gateway and its storage on the cluster",
    responses={
        **COMMON_ERRORS,
        503: {"model": ErrorBody, "description": "No broker could be asked."},
    },
)
async def usage(request: Request, caller: Caller) -> Usage:
    if not caller.may_cluster(Operation.DESCRIBE):
        raise ApiError(ErrorCode.FORBIDDEN, "reading usage needs DESCRIBE on the cluster")
    services = request.app.state.services
    surveyor: StorageSurveyor = request.app.state.storage
    try:
        survey = await surveyor.survey()
    except UpstreamError as exc:
        raise ApiError(ErrorCode.UNAVAILABLE, f"storage is unknown: {exc}") from None
    storage = tenant_storage(survey, caller.namespace)
    traffic = services.usage.of(caller.tenant)
    return Usage(
        tenant=caller.tenant,
        bytes_in=traffic.bytes_in,
        bytes_out=traffic.bytes_out,
        produce_requests=traffic.produce_requests,
        fetch_requests=traffic.fetch_requests,
        throttle_ms=traffic.throttle_ms,
        storage=StorageInfo(
            leader_bytes=storage.leader_bytes,
            replica_bytes=storage.replica_bytes,
            measured_at=datetime.fromtimestamp(survey.taken_at, UTC),
            complete=survey.complete,
            topics=[
                TopicStorageInfo(
                    topic=name, leader_bytes=t.leader_bytes, replica_bytes=t.replica_bytes
                )
                for name, t in storage.topics.items()
                if caller.may_topic(name, Operation.DESCRIBE)
            ],
        ),
    )
