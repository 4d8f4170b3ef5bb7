"""Client certificates as principals: the subject a certificate signs in with.

On the gateway's mutual-TLS listener a client authenticates with a
certificate signed by the platform's client CA; the API key whose
``certificate_subject`` equals the certificate's subject is who it is
(same ACLs, same quotas as a SASL login with that key).

Subjects are compared in one spelling: RFC 4514, most specific attribute
first (``CN=orders,OU=apps,O=acme``), the way Kafka's default principal
builder prints them (``User:CN=orders,OU=apps,O=acme``). A subject written
by a person (spaces after commas, another attribute order within a
multi-valued RDN) is parsed and printed again before it is stored, so the
comparison is between two canonical strings.
"""

from __future__ import annotations

from cryptography import x509
from shoal.tenancy.model import TenancyError

_MAX_SUBJECT = 1024


def canonical_subject(text: str) -> str:
    """``text`` (an RFC 4514 distinguished name) as the gateway will compare it;
    raises :class:`TenancyError` for what is not a usable subject."""
    if not text.strip() or len(text) > _MAX_SUBJECT:
        raise TenancyError(
            "certificate subject: give a distinguished name such as CN=orders,O=acme"
        )
    try:
        name = x509.Name.from_rfc4514_string(_without_separator_spaces(text))
    except ValueError as exc:
        raise TenancyError(f"certificate subject {text!r} is not an RFC 4514 name: {exc}") from None
    if not name.get_attributes_for_oid(x509.NameOID.COMMON_NAME):
        # Every client certificate tool names its subject with a CN; a subject without
        # one is almost always a typo (O=acme alone would match every acme certificate
        # that lacks a CN, if the CA issued one).
        raise TenancyError(f"certificate subject {text!r} has no CN (common name)")
    return name.rfc4514_string()


def _without_separator_spaces(text: str) -> str:
    """Drop spaces around the separators (``,`` ``+`` ``=``) that are not escaped:
    people write ``CN=orders, O=acme`` (and Java's X500Principal reads it), while the
    RFC 4514 parser wants none. A space that belongs to a value is escaped there."""
    out: list[str] = []
    escaped = after_separator = False
    for char in text.strip():
        if escaped:
            out.append(char)
            escaped = after_separator = False
        elif char == "\\":
            out.append(char)
            escaped, after_separator = True, False
        elif char in ",+=":
            while out and out[-1] == " " and not (len(out) > 1 and out[-2] == "\\"):
                out.pop()
            out.append(char)
            after_separator = True
        elif char != " " or not after_separator:
            out.append(char)
            after_separator = False
    return "".join(out)


def certificate_subject(der: bytes) -> str:
    """The subject of a DER certificate (what ``SSLObject.getpeercert(True)`` gives)."""
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()
