"""The gateway's trace context on the forwarded client_id, and the broker's stripping of it.

What must hold: the broker sees the client's client_id exactly, whatever the
client sent; it finds a parent only when the gateway gave one; a client cannot
make it find one of the client's choosing; the suffix fits every request
header version.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.wire import decode_request, encode_request, schema
from shoal.wire.trace_context import (
    MARKER,
    MAX_CLIENT_ID_BYTES,
    NO_PARENT,
    forwarded_client_id,
    split_client_id,
)

GATEWAY_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
INJECTED = "00-11111111111111111111111111111111-2222222222222222-01"

traceparents = st.builds(
    lambda trace, span, flags: f"00-{trace:032x}-{span:016x}-{flags:02x}",
    st.integers(1, 2**128 - 1),
    st.integers(1, 2**64 - 1),
    st.integers(0, 255),
)


@given(client_id=st.text(max_size=300), traceparent=st.none() | traceparents)
def test_the_broker_sees_the_clients_id_and_only_the_gateways_parent(
    client_id: str, traceparent: str | None
) -> None:
    assert split_client_id(forwarded_client_id(client_id, traceparent)) == (
        client_id,
        traceparent,
    )


@given(prefix=st.text(max_size=50), injected=traceparents)
def test_a_client_cannot_inject_a_parent_through_its_client_id(prefix: str, injected: str) -> None:
    malicious = prefix + MARKER + injected
    forwarded = forwarded_client_id(malicious, None)
    assert split_client_id(forwarded) == (malicious, None)
    assert split_client_id(forwarded_client_id(malicious, GATEWAY_PARENT)) == (
        malicious,
        GATEWAY_PARENT,
    )


def test_an_ordinary_client_id_is_forwarded_untouched_without_a_parent() -> None:
    assert forwarded_client_id("rdkafka", None) == "rdkafka"
    assert forwarded_client_id("", None) == ""


def test_an_absent_or_plain_client_id_carries_no_parent() -> None:
    assert split_client_id(None) == (None, None)
    assert split_client_id("") == ("", None)
    assert split_client_id("console-consumer-1") == ("console-consumer-1", None)


@pytest.mark.parametrize(
    "suffix",
    [
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # W3C: lowercase only
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # a version we do not write
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333x-01",
        "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
    ],
)
def test_a_malformed_suffix_is_left_in_the_client_id(suffix: str) -> None:
    client_id = "app" + MARKER + suffix
    assert split_client_id(client_id) == (client_id, None)


def test_a_suffix_with_an_invalid_trace_or_span_id_is_stripped_without_a_parent() -> None:
    zero_span = "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"
    assert split_client_id("app" + MARKER + NO_PARENT) == ("app", None)
    assert split_client_id("app" + MARKER + zero_span) == ("app", None)


def test_a_client_id_at_the_size_limit_gets_no_context_and_loses_its_fake_one() -> None:
    longest = "x" * (MAX_CLIENT_ID_BYTES - 56) + MARKER + INJECTED
    assert len(longest.encode()) == MAX_CLIENT_ID_BYTES
    forwarded = forwarded_client_id(longest, GATEWAY_PARENT)
    assert len(forwarded.encode()) <= MAX_CLIENT_ID_BYTES
    assert split_client_id(forwarded)[1] is None
    plain = "y" * MAX_CLIENT_ID_BYTES
    assert forwarded_client_id(plain, GATEWAY_PARENT) == plain


@pytest.mark.parametrize(
    ("api_key", "version", "body"),
    [
        (3, 1, {"topics": None}),  # request header v1 (not flexible)
        (3, 9, {"topics": None, "allow_auto_topic_creation": False}),  # header v2 (flexible)
        (18, 3, {"client_software_name": "x", "client_software_version": "1"}),
    ],
)
def test_the_broker_decoder_strips_the_suffix_in_every_header_version(
    api_key: int, version: int, body: dict[str, object]
) -> None:
    api = schema(api_key, version)
    request = api.request(
        **body,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    supported = {api_key: (version, version)}
    frame = encode_request(api, 7, forwarded_client_id("my-app", GATEWAY_PARENT), request)
    header, _, decoded = decode_request(frame[4:], supported, trace_context=True)
    assert (header.client_id, header.traceparent) == ("my-app", GATEWAY_PARENT)
    assert decoded == request
    # Anything but the broker's decoder (the gateway reading a client) takes it as sent.
    header, _, _ = decode_request(frame[4:], supported)
    assert header.client_id == "my-app" + MARKER + GATEWAY_PARENT
    assert header.traceparent is None
