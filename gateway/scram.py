"""The server side of SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka speaks it.

Two rounds, each a SaslAuthenticate (or, after SaslHandshake v0, a bare frame)::

    client-first  n,[a=authzid],n=<user>,r=<client nonce>[,ext=value...]
    server-first  r=<client nonce><server nonce>,s=<salt, base64>,i=<iterations>
    client-final  c=biws,r=<the whole nonce>,p=<ClientProof, base64>
    server-final  v=<ServerSignature, base64>

The user is the API key id; the server checks the proof against the key's
StoredKey and proves itself with its ServerKey (:mod:`shoal.tenancy.scram`),
so the secret is never needed here.

Kafka's rules (``ScramSaslServer``, ``ScramMessages``), which clients are
written against, and how they are kept:

* Only the gs2 flag ``n`` (no channel binding): ``y`` and ``p=`` are refused,
  and no ``-PLUS`` mechanism is offered.
* An authorization id must be empty or the username.
* The ``tokenauth`` extension asks for a delegation token; Shoal has none, so
  it is refused with that reason. Kafka ignores other extensions; scramp
  cannot parse multi-letter attribute names, so they are refused as malformed
  (no client we know sends one).
* A failure is never answered with an RFC 5802 ``e=`` server-final: Kafka
  answers SASL_AUTHENTICATION_FAILED, and so does the caller with the
  :class:`~shoal.gateway.sasl.SaslError` raised here. An unknown or revoked
  user is refused at the client-first message, as Kafka refuses it.

The message exchange is scramp's (a maintained SCRAM library, the one pg8000
uses for PostgreSQL); this module only adds Kafka's limits in front of it and
turns its errors into messages a client may be shown. The nonce, which makes
a recorded client-final useless on any other exchange, is checked here first
so that a replay is named as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import scramp
from shoal.gateway.sasl import SaslError
from shoal.tenancy.scram import ScramCredential, ScramMechanism

_MAX_MESSAGE: Final = 4096
_INVALID_PROOF: Final = "invalid-proof"
DELEGATION_EXTENSION: Final = "tokenauth"
"""Kafka's extension for delegation-token sign-in (``ScramLoginModule.TOKEN_AUTH_CONFIG``)."""


@dataclass(frozen=True, slots=True)
class ClientFirst:
    """What the gateway needs of a client-first message before it looks the user up."""

    mechanism: ScramMechanism
    username: str
    text: str


def _text(message: bytes, which: str) -> str:
    if len(message) > _MAX_MESSAGE:
        raise SaslError(f"SCRAM {which} message is too long")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SaslError(f"SCRAM {which} message is not UTF-8") from exc


def _saslname(value: str, what: str) -> str:
    """RFC 5802's saslname: ``,`` and ``=`` are sent as ``=2C`` and ``=3D``."""
    rest = value.replace("=2C", "").replace("=3D", "")
    if "=" in rest:
        raise SaslError(f"SCRAM {what} has a bad '=' escape")
    return value.replace("=2C", ",").replace("=3D", "=")


def parse_client_first(mechanism: ScramMechanism, message: bytes) -> ClientFirst:
    """Check the client-first message against Kafka's rules; :class:`SaslError` says why not."""
    text = _text(message, "client-first")
    flag, _, rest = text.partition(",")
    if flag == "y" or flag.startswith("p="):
        raise SaslError(
            f"{mechanism.value} here has no channel binding: the client must send gs2 flag 'n'"
        )
    authzid_field, comma, bare = rest.partition(",")
    if flag != "n" or not comma:
        raise SaslError("SCRAM client-first message must start with 'n,[a=authzid],'")
    if authzid_field and not authzid_field.startswith("a="):
        raise SaslError("SCRAM client-first message must start with 'n,[a=authzid],'")
    attributes = bare.split(",")
    if (
        len(attributes) < 2
        or not attributes[0].startswith("n=")
        or not attributes[1].startswith("r=")
    ):
        raise SaslError("SCRAM client-first message must go on with 'n=<username>,r=<nonce>'")
    username = _saslname(attributes[0][2:], "username")
    if not username or len(attributes[1]) <= 2:
        raise SaslError("SCRAM client-first message needs a username and a nonce")
    authzid = _saslname(authzid_field[2:], "authorization id") if authzid_field else ""
    if authzid and authzid != username:
        raise SaslError("SCRAM authorization id must be empty or the username")
    for extension in attributes[2:]:
        key, _, value = extension.partition("=")
        if key == DELEGATION_EXTENSION and value.lower() == "true":
            raise SaslError("delegation tokens are not supported here: sign in with an API key")
    return ClientFirst(mechanism, username, text)


class ScramExchange:
    """One exchange, begun with a client-first message and the user's credential.

    Single use: :meth:`finish` is called once, and the exchange is over
    whether it succeeds or not.
    """

    def __init__(
        self, first: ClientFirst, credential: ScramCredential, server_nonce: str | None = None
    ) -> None:
        """``server_nonce`` is drawn fresh (scramp's CSPRNG) unless given: tests give
        one to replay RFC 7677's example exchange."""
        if credential.mechanism is not first.mechanism:
            raise ValueError("the credential is not for this exchange's mechanism")
        self.mechanism = first.mechanism
        self.username = first.username

        def credential_of(_username: str) -> tuple[bytes, bytes, bytes, int]:
            return (
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            )

        self._server = scramp.ScramMechanism(first.mechanism.value).make_server(
            credential_of, s_nonce=server_nonce
        )
        try:
            self._server.set_client_first(first.text)
            self.server_first: bytes = self._server.get_server_first().encode()
        except scramp.ScramException as exc:
            raise SaslError(f"malformed SCRAM client-first message: {exc}") from None
        self._nonce = str(self._server.nonce)

    def finish(self, message: bytes) -> bytes:
        """Check the client-final message; the server-final message, or :class:`SaslError`."""
        text = _text(message, "client-final")
        nonces = [a[2:] for a in text.split(",") if a.startswith("r=")]
        if len(nonces) != 1:
            raise SaslError("SCRAM client-final message must be 'c=...,r=<nonce>,p=<proof>'")
        if nonces[0] != self._nonce:
            raise SaslError(
                "SCRAM client-final nonce is not this exchange's (a replayed or altered message)"
            )
        try:
            self._server.set_client_final(text)
            return str(self._server.get_server_final()).encode()
        except scramp.ScramException as exc:
            error = getattr(exc.server_error, "value", None)
            if error == _INVALID_PROOF:
                raise SaslError("invalid API key or secret") from None
            raise SaslError(f"malformed SCRAM client-final message: {exc}") from None
