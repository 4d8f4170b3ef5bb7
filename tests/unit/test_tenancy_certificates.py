"""Certificate subjects: the one spelling the gateway compares (RFC 4514, as Kafka prints them)."""

import datetime

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from shoal.tenancy.certificates import canonical_subject, certificate_subject
from shoal.tenancy.model import TenancyError


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("CN=orders,OU=apps,O=acme", "CN=orders,OU=apps,O=acme"),
        ("CN=orders, OU=apps, O=acme", "CN=orders,OU=apps,O=acme"),
        ("  CN = orders ,O=acme ", "CN=orders,O=acme"),
        # An escaped comma and the space after it belong to the value.
        (r"CN=Smith\, John, O=acme", r"CN=Smith\, John,O=acme"),
        ("CN=two words,O=a b", "CN=two words,O=a b"),
        ("CN=x+UID=3, O=y", "CN=x+UID=3,O=y"),
    ],
)
def test_a_subject_is_compared_in_one_spelling(written: str, canonical: str) -> None:
    assert canonical_subject(written) == canonical


def test_the_order_of_a_distinguished_name_matters() -> None:
    assert canonical_subject("O=acme,CN=orders") != canonical_subject("CN=orders,O=acme")


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        ("", "give a distinguished name"),
        ("   ", "give a distinguished name"),
        ("O=acme", "no CN"),
        ("orders", "not an RFC 4514 name"),
        ("CN=" + "x" * 2000, "give a distinguished name"),
    ],
)
def test_what_is_not_a_usable_subject_is_refused(written: str, reason: str) -> None:
    with pytest.raises(TenancyError, match=reason):
        canonical_subject(written)


def test_a_certificates_subject_matches_the_same_subject_written_by_hand() -> None:
    issued = trustme.CA().issue_cert(
        "orders.example",
        common_name="orders",
        organization_name="acme",
        organization_unit_name="apps",
        not_after=datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC),
    )
    der = x509.load_pem_x509_certificate(issued.cert_chain_pems[0].bytes()).public_bytes(
        Encoding.DER
    )
    assert certificate_subject(der) == canonical_subject("CN=orders, OU=apps, O=acme")
