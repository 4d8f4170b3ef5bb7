"""The gateway's W3C ``traceparent``, carried to the broker at the end of ``client_id``.

The Kafka protocol has no request-level trace header, and the one place every
request header has, in every version, flexible or not, is ``client_id`` (a
non-compact nullable string even in request header v2). The gateway re-encodes
every header it forwards, so it owns that field on the hop to the broker: when
its span for a request is sampled it appends

    "\\x00" + traceparent          (56 characters, traceparent as in W3C Trace Context:
                                    "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>")

and the broker's decoder strips exactly one such suffix, when it is present and
well-formed, before anything else (handlers, logs, group members' client ids)
sees the client id. One mechanism for every API version; record batches and
their headers are never involved.

A client cannot choose the broker's parent: its own ``client_id`` could end in
something suffix-shaped, so the gateway, whenever the id it forwards would
otherwise end in a suffix it did not write, appends :data:`NO_PARENT` (the
all-zero trace id W3C declares invalid). The broker strips that one, sees the
client's id exactly, and starts a span without a parent. Without a suffix the
id is forwarded untouched: the common case costs a length comparison.

Brokers are not reachable by tenants, so a suffix seen by a broker was written
by a gateway (or by an internal client that wants to parent the broker's span).
"""

from __future__ import annotations

import re
from typing import Final

MARKER: Final = "\x00"
TRACEPARENT_LENGTH: Final = 55
SUFFIX_LENGTH: Final = TRACEPARENT_LENGTH + len(MARKER)
NO_PARENT: Final = "00-" + "0" * 32 + "-" + "0" * 16 + "-00"
"""A well-formed suffix that carries no parent (W3C: an all-zero trace id is invalid)."""
MAX_CLIENT_ID_BYTES: Final = 32767
"""client_id is an int16-length string in every request header version."""

_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_INVALID_TRACE_ID: Final = "0" * 32
_INVALID_SPAN_ID: Final = "0" * 16


def forwarded_client_id(client_id: str, traceparent: str | None) -> str:
    """The client id the gateway sends the broker: the client's, plus ``traceparent`` if any.

    The broker recovers ``client_id`` exactly with :func:`split_client_id`, and finds
    ``traceparent`` only when the gateway gave one.
    """
    if traceparent is None and _suffix(client_id) is None:
        return client_id
    suffix = MARKER + (traceparent or NO_PARENT)
    if len(client_id) * 4 + SUFFIX_LENGTH > MAX_CLIENT_ID_BYTES and (
        len((client_id + suffix).encode()) > MAX_CLIENT_ID_BYTES
    ):
        # No room left in the header for a suffix: send no context, and if the
        # client's own id ends in a suffix, break its marker so the broker does
        # not read it (this client id is an attack or a fuzzer, not a client).
        if _suffix(client_id) is not None:
            cut = len(client_id) - SUFFIX_LENGTH
            return client_id[:cut] + "?" + client_id[cut + 1 :]
        return client_id
    return client_id + suffix


def split_client_id(client_id: str | None) -> tuple[str | None, str | None]:
    """(the client's id, the gateway's traceparent or None), from a broker's view of client_id.

    A suffix is stripped only when it is well-formed; anything else is a client id
    the gateway did not touch, and is returned whole.
    """
    match = _suffix(client_id)
    if match is None:
        return client_id, None
    assert client_id is not None
    original = client_id[:-SUFFIX_LENGTH]
    if match.group(1) == _INVALID_TRACE_ID or match.group(2) == _INVALID_SPAN_ID:
        return original, None
    return original, match.group(0)


def _suffix(client_id: str | None) -> re.Match[str] | None:
    """The well-formed traceparent ending ``client_id``, if any.

    The hot path's only cost: without the marker 56 characters from the end,
    it is a length comparison and one character's.
    """
    if client_id is None or len(client_id) < SUFFIX_LENGTH or client_id[-SUFFIX_LENGTH] != MARKER:
        return None
    return _TRACEPARENT.fullmatch(client_id, len(client_id) - TRACEPARENT_LENGTH)
