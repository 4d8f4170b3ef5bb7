"""SASL/PLAIN (RFC 4616): the message a client sends to authenticate.

``[authzid] NUL authcid NUL passwd``, UTF-8. The username (authcid) is the
API key id and the password its secret. As in Kafka, an authorization id, if
given, must equal the username: a key cannot act as another principal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PLAIN: Final = "PLAIN"
MECHANISMS: Final = (PLAIN,)
_MAX_MESSAGE: Final = 4096


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
