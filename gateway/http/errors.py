"""The JSON error body every route answers with, shaped as Confluent's REST v3.

``{"error_code": 40403, "message": "..."}``: ``error_code`` is the HTTP status
times 100 plus a number that tells apart errors of one status, so a client
can branch on it without parsing the message. The codes are a contract:
never renumber one, only add.
"""

from __future__ import annotations

import enum
from typing import Final

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from shoal.wire import ErrorCode as KafkaCode


class ErrorCode(enum.IntEnum):
    BAD_REQUEST = 40000
    INVALID_INPUT = 40001
    KAFKA_BAD_REQUEST = 40002
    """Kafka refused the request as invalid (a bad config, partition count, topic name)."""
    POLICY_VIOLATION = 40003
    """The tenant's limits refuse it (its partition limit)."""
    UNAUTHORIZED = 40100
    FORBIDDEN = 40300
    KAFKA_AUTHORIZATION = 40301
    """The key's ACLs do not allow this on the topic, group or cluster."""
    NOT_FOUND = 40400
    CLUSTER_NOT_FOUND = 40401
    PARTITION_NOT_FOUND = 40402
    TOPIC_NOT_FOUND = 40403
    GROUP_NOT_FOUND = 40404
    CONFIG_NOT_FOUND = 40405
    CONFLICT = 40900
    TOPIC_ALREADY_EXISTS = 40901
    RECORD_TOO_LARGE = 41300
    OFFSET_OUT_OF_RANGE = 41600
    UNDECODABLE_RECORD = 42200
    """A stored key or value does not decode in the format asked for."""
    BATCH_TOO_LARGE_TO_READ = 42201
    """A stored batch decompresses to more than the read may decode (its max_bytes)."""
    TOO_MANY_REQUESTS = 42900
    INTERNAL = 50000
    KAFKA_ERROR = 50002
    """Kafka answered with an error the gateway has no better status for."""
    UNAVAILABLE = 50300
    KAFKA_RETRIABLE = 50301
    """A passing Kafka condition (leader moving, coordinator loading): retry."""


class ErrorBody(BaseModel):
    error_code: int
    message: str


class ApiError(Exception):
    """Raised by routes; answered as :class:`ErrorBody` with its HTTP status."""

    def __init__(
        self, code: ErrorCode, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers

    @property
    def status(self) -> int:
        return int(self.code) // 100


def error_response(
    code: ErrorCode, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error_code=int(code), message=message)
    return JSONResponse(body.model_dump(), status_code=int(code) // 100, headers=headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    del request
    assert isinstance(exc, ApiError)
    return error_response(exc.code, exc.message, exc.headers)


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (a body that is not JSON, an unknown path) in our shape."""
    del request
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    body = ErrorBody(error_code=exc.status_code * 100, message=message)
    return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    del request
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
    )
    return error_response(ErrorCode.INVALID_INPUT, problems or "invalid request")


_KAFKA: Final[dict[KafkaCode, ErrorCode]] = {
    KafkaCode.unknown_topic_or_partition: ErrorCode.TOPIC_NOT_FOUND,
    KafkaCode.unknown_topic_id: ErrorCode.TOPIC_NOT_FOUND,
    KafkaCode.group_id_not_found: ErrorCode.GROUP_NOT_FOUND,
    KafkaCode.topic_authorization_failed: ErrorCode.KAFKA_AUTHORIZATION,
    KafkaCode.group_authorization_failed: ErrorCode.KAFKA_AUTHORIZATION,
    KafkaCode.cluster_authorization_failed: ErrorCode.KAFKA_AUTHORIZATION,
    KafkaCode.transactional_id_authorization_failed: ErrorCode.KAFKA_AUTHORIZATION,
    KafkaCode.topic_already_exists: ErrorCode.TOPIC_ALREADY_EXISTS,
    KafkaCode.policy_violation: ErrorCode.POLICY_VIOLATION,
    KafkaCode.invalid_topic_exception: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_partitions: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_replication_factor: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_replica_assignment: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_config: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_request: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_record: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_timestamp: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.corrupt_message: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.invalid_group_id: ErrorCode.KAFKA_BAD_REQUEST,
    KafkaCode.message_too_large: ErrorCode.RECORD_TOO_LARGE,
    KafkaCode.record_list_too_large: ErrorCode.RECORD_TOO_LARGE,
    KafkaCode.offset_out_of_range: ErrorCode.OFFSET_OUT_OF_RANGE,
    KafkaCode.throttling_quota_exceeded: ErrorCode.TOO_MANY_REQUESTS,
    KafkaCode.not_leader_or_follower: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.leader_not_available: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.broker_not_available: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.fenced_leader_epoch: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.request_timed_out: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.network_exception: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.not_enough_replicas: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.not_enough_replicas_after_append: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.not_coordinator: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.coordinator_not_available: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.coordinator_load_in_progress: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.kafka_storage_error: ErrorCode.KAFKA_RETRIABLE,
    KafkaCode.reassignment_in_progress: ErrorCode.KAFKA_RETRIABLE,
}


def kafka_error_code(code: KafkaCode, partition_scoped: bool = False) -> ErrorCode:
    """The HTTP error code for a Kafka error code.

    UNKNOWN_TOPIC_OR_PARTITION is a missing partition when the topic is known
    to exist (``partition_scoped``), a missing topic otherwise.
    """
    if partition_scoped and code == KafkaCode.unknown_topic_or_partition:
        return ErrorCode.PARTITION_NOT_FOUND
    return _KAFKA.get(code, ErrorCode.KAFKA_ERROR)


def kafka_name(code: KafkaCode) -> str:
    """Kafka's own spelling of an error (``UNKNOWN_TOPIC_OR_PARTITION``)."""
    return code.name.upper()


def kafka_error(
    code: KafkaCode, message: str | None = None, partition_scoped: bool = False
) -> ApiError:
    """An :class:`ApiError` for a Kafka error, its Kafka name in the message."""
    text = kafka_name(code) if not message else f"{kafka_name(code)}: {message}"
    return ApiError(kafka_error_code(code, partition_scoped), text)


# Every route may answer these; listing them keeps the OpenAPI document honest
# for clients and for schemathesis.
COMMON_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "The request is malformed."},
    401: {"model": ErrorBody, "description": "No valid API key or token."},
    403: {"model": ErrorBody, "description": "The tenant's ACLs do not allow it."},
}
