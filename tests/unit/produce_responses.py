"""Produce v9 responses with chosen error codes, for tests of what reads them (metrics,
spans)."""

from __future__ import annotations

from typing import Any, Final

from shoal.wire import ErrorCode, schema

PRODUCE: Final = schema(0, 9)


def produce_response(*codes_by_topic: tuple[str, list[ErrorCode]]) -> Any:
    """A response with, for each topic named, one partition per code, numbered from 0."""
    return PRODUCE.response(
        responses=tuple(
            PRODUCE.make(
                "TopicProduceResponse",
                name=name,
                partition_responses=tuple(
                    PRODUCE.make(
                        "PartitionProduceResponse",
                        index=i,
                        error_code=code,
                        base_offset=-1,
                        log_append_time=None,
                        log_start_offset=-1,
                        record_errors=(),
                        error_message=None,
                    )
                    for i, code in enumerate(codes)
                ),
            )
            for name, codes in codes_by_topic
        ),
        throttle_time=0,
    )
