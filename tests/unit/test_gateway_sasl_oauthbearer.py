"""SASL/OAUTHBEARER's client message (RFC 7628 section 3.1), parsed strictly.

What librdkafka and the Java client send must parse, extensions and an
authorization id included; every way the message can be malformed is a
:class:`SaslError` with a message, never a crash or a silent accept; and the
token never shows up in a repr.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.gateway.sasl import BearerCredentials, SaslError, parse_oauthbearer

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJLYWJjIn0.c2lnbmF0dXJl"


def test_the_message_librdkafka_sends_parses() -> None:
    parsed = parse_oauthbearer(f"n,,\x01auth=Bearer {TOKEN}\x01\x01".encode())
    assert parsed == BearerCredentials(TOKEN, None, {})


def test_an_authorization_id_and_extensions_are_kept() -> None:
    message = f"n,a=K=2Cx=3Dy,\x01traceId=abc 1\x01auth=Bearer {TOKEN}\x01\x01"
    parsed = parse_oauthbearer(message.encode())
    assert parsed.authzid == "K,x=y"
    assert parsed.extensions == {"traceId": "abc 1"}
    assert parsed.token == TOKEN


def test_the_auth_scheme_is_case_insensitive_and_may_have_more_spaces() -> None:
    assert parse_oauthbearer(f"y,,\x01auth=bearer  {TOKEN}\x01\x01".encode()).token == TOKEN


def test_the_token_never_shows_in_a_repr() -> None:
    assert TOKEN not in repr(parse_oauthbearer(f"n,,\x01auth=Bearer {TOKEN}\x01\x01".encode()))


@pytest.mark.parametrize(
    "message,why",
    [
        (b"", "start"),
        (b"\x01", "aborted"),
        (f"auth=Bearer {TOKEN}\x01\x01".encode(), "start"),
        (f"p=tls-unique,,\x01auth=Bearer {TOKEN}\x01\x01".encode(), "start"),
        (f"n,x=y,\x01auth=Bearer {TOKEN}\x01\x01".encode(), "start"),
        (f"n,a=,\x01auth=Bearer {TOKEN}\x01\x01".encode(), "empty"),
        (f"n,a=x=41,\x01auth=Bearer {TOKEN}\x01\x01".encode(), "escape"),
        (f"n,,\x01auth=Bearer {TOKEN}\x01".encode(), "end"),
        (f"n,,\x01auth=Bearer {TOKEN}".encode(), "end"),
        (b"n,,\x01\x01", "no auth"),
        (b"n,,\x01host=x\x01\x01", "no auth"),
        (f"n,,\x01auth=Basic {TOKEN}\x01\x01".encode(), "Bearer"),
        (b"n,,\x01auth=Bearer \x01\x01", "Bearer"),
        (b"n,,\x01auth=Bearer a b\x01\x01", "Bearer"),
        (f"n,,\x01auth=Bearer {TOKEN}\x01auth=Bearer x\x01\x01".encode(), "twice"),
        (f"n,,\x01auth=Bearer {TOKEN}\x01\x01\x01".encode(), "malformed"),
        (f"n,,\x01k1=v\x01auth=Bearer {TOKEN}\x01\x01".encode(), "malformed"),
        (f"n,,\x01k=\x7f\x01auth=Bearer {TOKEN}\x01\x01".encode(), "malformed"),
        (f"n,,\x01noequals\x01auth=Bearer {TOKEN}\x01\x01".encode(), "malformed"),
        (b"n,,\x01auth=Bearer \xff\x01\x01", "UTF-8"),
        (b"n,,\x01auth=Bearer " + b"a" * 70000 + b"\x01\x01", "too long"),
    ],
)
def test_a_malformed_message_is_refused_with_a_reason(message: bytes, why: str) -> None:
    with pytest.raises(SaslError, match=why):
        parse_oauthbearer(message)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_are_refused_never_crash(message: bytes) -> None:
    try:
        parsed = parse_oauthbearer(message)
    except SaslError:
        return
    assert parsed.token
