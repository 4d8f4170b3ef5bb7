"""The SASL messages a client sends to authenticate: PLAIN and OAUTHBEARER.

(SCRAM-SHA-256 and SCRAM-SHA-512, an exchange of two rounds, are in
:mod:`shoal.gateway.scram`.)

SASL/PLAIN (RFC 4616): ``[authzid] NUL authcid NUL passwd``, UTF-8. The
username (authcid) is the API key id and the password its secret. As in
Kafka, an authorization id, if given, must equal the username: a key cannot
act as another principal.

SASL/OAUTHBEARER (RFC 7628 section 3.1), the client's one message::

    gs2-header kvsep *(key "=" value kvsep) kvsep
    gs2-header = ("n" / "y") "," ["a=" saslname] ","     ; no channel binding ("p=")
    kvsep      = %x01
    auth       = "Bearer" 1*SP b64token                   ; the token (RFC 6750)

One ``auth`` pair is required; other pairs are SASL extensions (Kafka's
``sasl.oauthbearer.extensions``), kept for the caller. Parsing is strict,
as Kafka's ``OAuthBearerClientInitialResponse`` is: an alphabetic key, a
value of printable ASCII, space, tab, CR or LF, no key twice, and a size
limit well above any real token.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

PLAIN: Final = "PLAIN"
OAUTHBEARER: Final = "OAUTHBEARER"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
MECHANISMS: Final = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512, OAUTHBEARER)
"""What SaslHandshake offers, in the order a Kafka broker lists its enabled ones."""
_MAX_MESSAGE: Final = 4096
_MAX_OAUTHBEARER_MESSAGE: Final = 65536 + 4096
_KVSEP: Final = "\x01"
_GS2_HEADER: Final = re.compile(r"^[ny],(?:a=([^,]*))?,$")
_KEY: Final = re.compile(r"^[A-Za-z]+$")
_VALUE: Final = re.compile(r"^[\x21-\x7e \t\r\n]*$")
_BEARER: Final = re.compile(r"^bearer +([A-Za-z0-9\-._~+/]+=*)$", re.IGNORECASE)
_SASLNAME_ESCAPE: Final = re.compile(r"=(?!2C|3D)")


class SaslError(ValueError):
    """The exchange is malformed; the message is safe to show the client."""


@dataclass(frozen=True, slots=True)
class PlainCredentials:
    username: str
    password: str = ""

    def __repr__(self) -> str:
        return f"PlainCredentials(username={self.username!r}, password=<hidden>)"


def parse_plain(message: bytes) -> PlainCredentials:
    if len(message) > _MAX_MESSAGE:
        raise SaslError("SASL/PLAIN message is too long")
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise SaslError("SASL/PLAIN message must be authzid NUL username NUL password")
    try:
        authzid, username, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError as exc:
        raise SaslError("SASL/PLAIN message is not UTF-8") from exc
    if not username or not password:
        raise SaslError("SASL/PLAIN needs a username and a password")
    if authzid and authzid != username:
        raise SaslError("SASL/PLAIN authorization id must be empty or the username")
    return PlainCredentials(username, password)


@dataclass(frozen=True, slots=True)
class BearerCredentials:
    token: str
    authzid: str | None = None
    extensions: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"BearerCredentials(authzid={self.authzid!r}, token=<hidden>)"


def parse_oauthbearer(message: bytes) -> BearerCredentials:
    if len(message) > _MAX_OAUTHBEARER_MESSAGE:
        raise SaslError("SASL/OAUTHBEARER message is too long")
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SaslError("SASL/OAUTHBEARER message is not UTF-8") from exc
    if text == _KVSEP:
        raise SaslError("SASL/OAUTHBEARER exchange aborted by the client")
    header, sep, rest = text.partition(_KVSEP)
    match = _GS2_HEADER.match(header)
    if not sep or match is None:
        raise SaslError("SASL/OAUTHBEARER message must start with 'n,[a=authzid],' and \\x01")
    authzid = None if match.group(1) is None else _saslname(match.group(1))
    if not rest.endswith(_KVSEP + _KVSEP) and rest != _KVSEP:
        raise SaslError("SASL/OAUTHBEARER message must end with \\x01\\x01")
    pairs: dict[str, str] = {}
    for item in rest[:-2].split(_KVSEP) if rest != _KVSEP else []:
        key, equals, value = item.partition("=")
        if not equals or not _KEY.match(key) or not _VALUE.match(value):
            raise SaslError("SASL/OAUTHBEARER key=value pair is malformed")
        if key in pairs:
            raise SaslError(f"SASL/OAUTHBEARER key {key!r} is given twice")
        pairs[key] = value
    auth = pairs.pop("auth", None)
    if auth is None:
        raise SaslError("SASL/OAUTHBEARER message has no auth=Bearer <token>")
    bearer = _BEARER.match(auth)
    if bearer is None:
        raise SaslError("SASL/OAUTHBEARER auth must be 'Bearer <token>'")
    return BearerCredentials(bearer.group(1), authzid, pairs)


def _saslname(value: str) -> str:
    if not value:
        raise SaslError("SASL/OAUTHBEARER authorization id is empty")
    if _SASLNAME_ESCAPE.search(value):
        raise SaslError("SASL/OAUTHBEARER authorization id has a bad '=' escape")
    return value.replace("=2C", ",").replace("=3D", "=")
