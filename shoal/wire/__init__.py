"""The Kafka wire protocol: frames, request headers, and kio's message schemas.

Nothing outside this package imports kio; see :mod:`shoal.wire.codec`.
"""

from kio.schema.errors import ErrorCode

from shoal.wire.codec import (
    ApiSchema,
    MalformedRequestError,
    RequestHeader,
    UnknownApiKeyError,
    UnsupportedVersionError,
    WireError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    known_api_keys,
    load_schemas,
    schema,
)
from shoal.wire.fetch_session import FINAL_EPOCH, INITIAL_EPOCH, NO_SESSION
from shoal.wire.framing import FrameReader, FrameSizeError
from shoal.wire.splice import Chunk, FileRegion, RecordsSplicer, chunk_size

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "NO_SESSION",
    "ApiSchema",
    "Chunk",
    "ErrorCode",
    "FileRegion",
    "FrameReader",
    "FrameSizeError",
    "MalformedRequestError",
    "RecordsSplicer",
    "RequestHeader",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "WireError",
    "chunk_size",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "known_api_keys",
    "load_schemas",
    "schema",
]
