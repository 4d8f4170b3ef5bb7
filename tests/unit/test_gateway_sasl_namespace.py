"""The gateway's two smallest gates: who is asking (SASL/PLAIN) and whose names are whose.

:func:`parse_plain` is the first thing a connection's bytes reach, so each way a
message can be malformed has its own case, and the password must never show
up in a repr (logs print credentials by accident, not on purpose).
:class:`Namespace` is what keeps tenants apart on shared brokers: mapping in
always lands inside the tenant's prefix, and mapping out answers None for
anything that is not the tenant's, the bare prefix included.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.gateway.namespace import Namespace
from shoal.gateway.sasl import PlainCredentials, SaslError, parse_plain

ACME = Namespace("acme")


# Namespace


def test_inward_puts_the_tenant_prefix_in_front() -> None:
    assert ACME.prefix == "acme."
    assert ACME.inward("orders") == "acme.orders"


def test_outward_strips_the_prefix_of_the_tenants_own_names() -> None:
    assert ACME.outward("acme.orders") == "orders"


def test_names_with_dots_belong_to_the_tenant_of_the_first_dot() -> None:
    assert ACME.inward("payments.eu.v2") == "acme.payments.eu.v2"
    assert ACME.outward("acme.payments.eu.v2") == "payments.eu.v2"
    assert ACME.owns("acme.payments.eu.v2")


def test_a_name_that_looks_like_another_tenants_stays_inside_the_prefix() -> None:
    broker_name = ACME.inward("globex.orders")
    assert broker_name == "acme.globex.orders"
    assert ACME.owns(broker_name)
    assert not Namespace("globex").owns(broker_name)
    assert ACME.outward(broker_name) == "globex.orders"


def test_the_bare_prefix_is_not_a_name_the_tenant_owns() -> None:
    assert not ACME.owns("acme.")
    assert ACME.outward("acme.") is None


@pytest.mark.parametrize(
    "broker_name",
    [
        "globex.orders",
        "acme",  # the tenant's name alone, without the separating dot
        "acme-eu.orders",  # a tenant whose name starts with "acme"
        "acmeorders",
        "__consumer_offsets",
        "",
        ".acme.orders",
        "ACME.orders",
    ],
)
def test_names_outside_the_prefix_are_not_the_tenants(broker_name: str) -> None:
    assert not ACME.owns(broker_name)
    assert ACME.outward(broker_name) is None


def test_outward_of_none_is_none() -> None:
    assert not ACME.owns(None)
    assert ACME.outward(None) is None


@given(st.text(min_size=1))
def test_every_name_maps_in_and_back_out_unchanged(name: str) -> None:
    broker_name = ACME.inward(name)
    assert ACME.owns(broker_name)
    assert ACME.outward(broker_name) == name
    assert Namespace("globex").outward(broker_name) is None


# SASL/PLAIN


def test_parse_plain_reads_username_and_password() -> None:
    assert parse_plain(b"\0key-1\0s3cret") == PlainCredentials("key-1", "s3cret")


def test_parse_plain_accepts_an_authzid_equal_to_the_username() -> None:
    assert parse_plain(b"key-1\0key-1\0s3cret") == PlainCredentials("key-1", "s3cret")


def test_parse_plain_refuses_an_authzid_naming_another_principal() -> None:
    with pytest.raises(SaslError, match="authorization id"):
        parse_plain(b"admin\0key-1\0s3cret")


@pytest.mark.parametrize(
    "message",
    [b"key-1s3cret", b"key-1\0s3cret", b"", b"a\0key-1\0s3cret\0extra"],
    ids=["no-nul", "one-nul", "empty", "three-nuls"],
)
def test_parse_plain_refuses_a_message_without_exactly_two_nuls(message: bytes) -> None:
    with pytest.raises(SaslError, match="authzid NUL username NUL password"):
        parse_plain(message)


@pytest.mark.parametrize(
    "message",
    [b"\0\0s3cret", b"\0key-1\0", b"\0\0"],
    ids=["empty-user", "empty-password", "both-empty"],
)
def test_parse_plain_needs_a_username_and_a_password(message: bytes) -> None:
    with pytest.raises(SaslError, match="needs a username and a password"):
        parse_plain(message)


@pytest.mark.parametrize(
    "message",
    [b"\0key-\xff\0s3cret", b"\0key-1\0s3\xc3cret", b"\xfe\0key-1\0s3cret"],
    ids=["username", "password", "authzid"],
)
def test_parse_plain_refuses_bytes_that_are_not_utf8(message: bytes) -> None:
    with pytest.raises(SaslError, match="not UTF-8"):
        parse_plain(message)


def test_parse_plain_accepts_non_ascii_utf8() -> None:
    creds = parse_plain("\0clé\0mot-de-passe-é".encode())
    assert creds == PlainCredentials("clé", "mot-de-passe-é")


def test_parse_plain_accepts_a_message_at_the_size_limit() -> None:
    message = b"\0key-1\0" + b"p" * (4096 - len(b"\0key-1\0"))
    assert len(message) == 4096
    assert parse_plain(message).password == "p" * (4096 - 7)


def test_parse_plain_refuses_a_message_over_the_size_limit() -> None:
    message = b"\0key-1\0" + b"p" * (4097 - len(b"\0key-1\0"))
    with pytest.raises(SaslError, match="too long"):
        parse_plain(message)


def test_sasl_errors_are_value_errors_the_session_can_show() -> None:
    with pytest.raises(ValueError, match="SASL/PLAIN"):
        parse_plain(b"garbage")


def test_credentials_repr_shows_the_username_and_hides_the_password() -> None:
    creds = parse_plain(b"\0key-1\0hunter2-very-secret")
    for text in (repr(creds), str(creds), f"{creds}", f"{creds!r}", repr([creds])):
        assert "hunter2-very-secret" not in text
        assert "key-1" in text
        assert "<hidden>" in text
