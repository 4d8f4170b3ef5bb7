"""One client connection through the gateway: authenticate, then rewrite and forward.

Phases:

1. **Authentication.** Only ApiVersions, SaslHandshake (PLAIN,
   SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER) and SaslAuthenticate are
   accepted; anything else closes the connection, as Kafka closes it. PLAIN
   and OAUTHBEARER take one SaslAuthenticate, SCRAM two (the first answered
   with the server-first challenge, :mod:`shoal.gateway.scram`). Wrong or
   revoked credentials, a refused token, or a malformed exchange get
   SASL_AUTHENTICATION_FAILED with a message saying why, and the connection
   is closed after the same delay whatever the mechanism. A client that has not
   authenticated within ``authentication_timeout_ms`` is disconnected.
2. **Serving.** Requests are handled strictly in order. Each is decoded,
   checked and rewritten (:mod:`shoal.gateway.apis`), then either answered
   by the gateway or forwarded on this connection's own connection to its
   broker (the bootstrap port's go to any broker, a broker port's to that
   broker). Clients pipeline freely: answers are written in request order,
   whichever of gateway and broker produced them.

Re-authentication (KIP-368): an OAUTHBEARER session lasts as long as its
token, and SaslAuthenticate says so in ``session_lifetime_ms`` (PLAIN
sessions do not expire: 0). The client logs in again on the same connection
before then, with SaslHandshake and SaslAuthenticate, same mechanism and
same principal, as Kafka requires; the new token's expiry becomes the
session's. A connection whose session has ended is closed at its next
request other than a re-authentication, as Kafka closes it.

Quotas: a produce or fetch request waits, before it is forwarded, until its
tenant's budget lets it through (:mod:`shoal.gateway.admission`; the budget is
the tenant's, shared by all its connections). A produce is charged its size
then, a fetch reserves what it may ask for and is charged its answer's size on
the way back. The answer carries the larger of the broker's and the gateway's
``throttle_time_ms``, and the connection is not read again until the
gateway's throttle has passed (KIP-219). CreateTopics, CreatePartitions and
DeleteTopics are charged to the tenant's controller mutation quota by their
rewriters (:mod:`shoal.gateway.mutation_quota`); the throttle they report
(:attr:`~shoal.gateway.apis.base.Forward.throttle_ms`) is merged and muted alike.
The request quota (:mod:`shoal.gateway.request_quota`) charges the event loop's
time spent on each request's own code (decoding, rewriting, encoding, both ways;
never its waits, so a Fetch long-poll costs only its handling) when its answer is
ready; the answer carries the time until the tenant's debt is paid, and the
connection is muted that long. While the tenant owes more than a window, none of
its connections is read. ApiVersions and (re-)authentication are not charged.
A login is charged to the tenant's connection creation rate once its credentials
are accepted (:mod:`shoal.gateway.connection_rate`): held until its turn, the
authentication timeout moved later by the hold, or refused when the hold would be
too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from shoal.gateway.access import TenantAccess
from shoal.gateway.admission import charge_request, mutation_charger
from shoal.gateway.apis import (
    API_VERSIONS,
    REWRITERS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
)
from shoal.gateway.apis.base import Answer, RefusedRequestError, RequestContext
from shoal.gateway.cluster_view import BrokerAddress
from shoal.gateway.connection_rate import refusal_message
from shoal.gateway.fetch_session import ClientFetchSession
from shoal.gateway.http.auth import TokenError
from shoal.gateway.quotas import FetchTicket
from shoal.gateway.request_quota import Stopwatch, timed
from shoal.gateway.sasl import (
    MECHANISMS,
    OAUTHBEARER,
    SaslError,
    parse_oauthbearer,
    parse_plain,
)
from shoal.gateway.scram import ScramExchange, parse_client_first
from shoal.gateway.storage_limit import storage_check
from shoal.gateway.tls_stream import TlsStream
from shoal.gateway.tracing import RequestTrace
from shoal.gateway.upstream import BrokerConnection, UpstreamError
from shoal.tenancy.certificates import certificate_subject
from shoal.tenancy.scram import ScramCredential, ScramMechanism

from shoal.wire import (
    ApiSchema,
    ErrorCode,
    RequestHeader,
    UnsupportedVersionError,
    WireError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    schema,
)
from shoal.wire.trace_context import forwarded_client_id

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices, Listener

log = logging.getLogger(__name__)

E = ErrorCode
PRODUCE: Final = 0
FETCH: Final = 1
MAX_IN_FLIGHT: Final = 100
_SIZE: Final = struct.Struct(">i")
_FAILED_AUTH_DELAY_S: Final = 0.1
"""Kafka's connection.failed.authentication.delay.ms: slows password guessing."""
_AUTH_APIS: Final = {API_VERSIONS: (0, 4), SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
CERTIFICATE: Final = "SSL"
"""How a mutual-TLS session signed in, where a SASL one names its mechanism."""
_MIN_SESSION_S: Final = 1.0
"""A token accepted within its leeway past ``exp`` still gets a session this long."""


class _ClosedError(Exception):
    """The session ends; the message says why (logged, never sent)."""


class _LoginRefusedError(Exception):
    """A SASL login was refused; the message is safe to show the client."""


@dataclass(frozen=True, slots=True)
class _Login:
    key_id: str
    tenant: str
    rights: Callable[[], TenantAccess | None]
    expires_at: float | None
    """Unix seconds when the credential ends (a token's exp); None for API keys."""
    server_final: bytes = b""
    """The mechanism's last word to the client (SCRAM's server signature)."""


@dataclass(frozen=True, slots=True)
class _Challenge:
    """The login goes on: send ``data`` to the client and wait for its next message."""

    data: bytes


_SCRAM_MECHANISMS: Final = {m.value: m for m in ScramMechanism}


def _no_rights() -> TenantAccess | None:
    return None


@dataclass(slots=True)
class _Pending:
    slot: asyncio.Future[bytes]
    header: RequestHeader
    api: ApiSchema
    finish: Callable[[Any], Any]
    tenant: str
    fetch_ticket: FetchTicket | None
    watch: Stopwatch
    trace: RequestTrace | None = None


class ClientSession:
    def __init__(
        self,
        services: GatewayServices,
        listener: Listener,
        node_id: int | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.services = services
        self.listener = listener
        self.node_id = node_id
        self._reader: asyncio.StreamReader | TlsStream = reader
        self._writer: asyncio.StreamWriter | TlsStream = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.key_id: str | None = None
        self._mechanism: str | None = None
        self._scram: ScramExchange | None = None
        """A SCRAM exchange between its two rounds."""
        self._rights: Callable[[], TenantAccess | None] = _no_rights
        self._session_ends: float | None = None
        self._slots: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        self._pending: deque[_Pending] = deque()
        self._upstream: BrokerConnection | None = None
        self._fetch_session = ClientFetchSession()
        """This connection's fetch session (KIP-227): its broker's, on ``_upstream``."""
        self._fetch_in_flight: asyncio.Future[bytes] | None = None
        """The answer to this connection's last forwarded fetch."""
        self._upstream_reader: asyncio.Task[None] | None = None
        self._muted_until = 0.0
        self._task: asyncio.Task[None] | None = None
        self._counted_for: str | None = None
        """The tenant this connection counts against (its connection limit)."""
        self._login_turn = 0
        """The login's turn its work goes on in (:mod:`shoal.gateway.login_turns`)."""
        self._auth_deadline: asyncio.Timeout | None = None
        """The authentication timeout, moved later by as long as a login is held."""

    # -- lifecycle ---------------------------------------------------------------

    async def run(self) -> None:
        self._task = asyncio.current_task()
        writer_task = asyncio.create_task(self._write_answers())
        reason = "client closed the connection"
        try:
            timeout_s = self.services.config.authentication_timeout_ms / 1000
            try:
                async with asyncio.timeout(timeout_s) as self._auth_deadline:
                    if self.listener.client_certificates:
                        await self._authenticate_with_certificate()
                    else:
                        await self._authenticate()
            except TimeoutError:
                raise _ClosedError(f"not authenticated within {timeout_s:g}s") from None
            self.services.sessions_by_key.setdefault(self.key_id or "", set()).add(self)
            await self._serve()
        except _ClosedError as exc:
            reason = str(exc)
        except (WireError, RefusedRequestError, UpstreamError) as exc:
            reason = str(exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            reason = "closed by the gateway"
        except Exception as exc:
            # A bug in one rewriter must cost one connection, never the gateway.
            log.exception("event=gateway_session_failed peer=%s", self.peer)
            reason = f"internal error {type(exc).__name__}"
        finally:
            log.info(
                "event=gateway_connection_closed peer=%s key=%s reason=%s",
                self.peer,
                self.key_id or "-",
                reason.replace(" ", "_"),
            )
            await self._shutdown(writer_task)

    async def _shutdown(self, writer_task: asyncio.Task[None]) -> None:
        if self.key_id is not None:
            self.services.sessions_by_key.get(self.key_id, set()).discard(self)
        if self._counted_for is not None:
            self.services.admission.traffic.disconnected(self._counted_for)
        if self._upstream_reader is not None:
            self._upstream_reader.cancel()
        for pending in self._pending:
            pending.slot.cancel()
            if pending.trace is not None:
                pending.trace.abandon("connection closed before the answer")
        with contextlib.suppress(asyncio.QueueFull):
            self._slots.put_nowait(None)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(writer_task, 2.0)
        writer_task.cancel()
        if self._upstream is not None:
            self._upstream.close()
        self._writer.close()

    def close(self) -> None:
        """End the session from outside (its key was revoked, the gateway stops)."""
        if self._task is not None:
            self._task.cancel()

    # -- frames ------------------------------------------------------------------

    async def _read_frame(self) -> bytes:
        (size,) = _SIZE.unpack(await self._reader.readexactly(_SIZE.size))
        if not 0 <= size <= self.services.config.socket_request_max_bytes:
            raise _ClosedError(f"request of {size} bytes is outside the allowed size")
        return await self._reader.readexactly(size)

    async def _read_login_frame(self) -> bytes:
        """The next frame of a login, once the logins' turns (:mod:`shoal.gateway.login_turns`)
        let its work run."""
        frame = await self._read_frame()
        self._login_turn = await self.services.login_turns.take()
        return frame

    async def _answer(self, header: RequestHeader, api: ApiSchema, body: Any) -> None:
        slot: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        slot.set_result(b"".join(encode_response(header, api, body)))  # type: ignore[arg-type]
        await self._slots.put(slot)

    async def _write_answers(self) -> None:
        while (slot := await self._slots.get()) is not None:
            try:
                data = await slot
            except asyncio.CancelledError:
                return
            self._writer.write(data)
            await self._writer.drain()

    # -- authentication ------------------------------------------------------------

    async def _authenticate(self) -> None:
        mechanism: str | None = None
        while True:
            try:
                header, api, body = self._decode(await self._read_login_frame(), _AUTH_APIS)
            except _UnsupportedApiVersionsError as exc:
                await self._answer_unsupported_api_versions(exc.header)
                continue
            if header.api_key == API_VERSIONS:
                await self._answer(header, api, self._api_versions(api, E.none))
            elif header.api_key == SASL_HANDSHAKE:
                if body.mechanism not in MECHANISMS:
                    await self._answer(
                        header,
                        api,
                        api.response(
                            error_code=E.unsupported_sasl_mechanism, mechanisms=MECHANISMS
                        ),
                    )
                    raise _ClosedError(f"unsupported SASL mechanism {body.mechanism!r}")
                mechanism = body.mechanism
                self._scram = None
                await self._answer(
                    header, api, api.response(error_code=E.none, mechanisms=MECHANISMS)
                )
                if header.api_version == 0:
                    # SaslHandshake v0: tokens go both ways as bare frames, with no
                    # Kafka header; success is the mechanism's last word (empty
                    # for PLAIN), failure a closed connection.
                    try:
                        step = await self._login(body.mechanism, await self._read_login_frame())
                        while isinstance(step, _Challenge):
                            await self._send_bare(step.data)
                            step = await self._login(body.mechanism, await self._read_login_frame())
                        await self._pace_login(step)
                        self._count_connection(step)
                    except _LoginRefusedError:
                        await asyncio.sleep(_FAILED_AUTH_DELAY_S)
                        raise _ClosedError("authentication failed") from None
                    self._begin_session(body.mechanism, step)
                    await self._send_bare(step.server_final)
                    return
            elif mechanism is None:
                raise _ClosedError("SaslAuthenticate before SaslHandshake")
            else:
                try:
                    login = await self._login(mechanism, body.auth_bytes)
                    if isinstance(login, _Challenge):
                        await self._answer(header, api, _challenge(api, login.data))
                        continue
                    await self._pace_login(login)
                    self._count_connection(login)
                except _LoginRefusedError as exc:
                    await self._refuse(header, api, str(exc))
                    raise _ClosedError("authentication failed") from None
                lifetime = self._begin_session(mechanism, login)
                await self._answer(header, api, _authenticated(api, lifetime, login.server_final))
                log.info(
                    "event=gateway_authenticated peer=%s key=%s mechanism=%s",
                    self.peer,
                    login.key_id,
                    mechanism,
                )
                return

    async def _authenticate_with_certificate(self) -> None:
        """The TLS handshake, then the key the client certificate's subject names."""
        tls = self.listener.tls
        assert tls is not None
        reader, writer = self._reader, self._writer
        assert isinstance(reader, asyncio.StreamReader)
        assert isinstance(writer, asyncio.StreamWriter)
        stream = TlsStream(reader, writer, tls)
        self._reader = self._writer = stream
        try:
            await stream.handshake()
        except ssl.SSLError as exc:
            self.services.metrics.authentication_failed("kafka")
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            log.info(
                "event=gateway_auth_failed peer=%s mechanism=SSL reason=%s",
                self.peer,
                str(reason).replace(" ", "_"),
            )
            raise _ClosedError(f"TLS handshake failed: {reason}") from None
        der = stream.ssl_object.getpeercert(binary_form=True)
        assert der is not None  # CERT_REQUIRED
        subject = certificate_subject(der)
        tenancy = self.services.tenancy
        if tenancy.key_for_subject(subject) is None:
            await tenancy.load()  # a key given the subject since the last poll
        key_id = tenancy.key_for_subject(subject)
        access = None if key_id is None else tenancy.access(key_id)
        if key_id is None or access is None:
            self.services.metrics.authentication_failed("kafka")
            log.info(
                "event=gateway_auth_failed peer=%s mechanism=SSL subject=%s reason=no_key",
                self.peer,
                subject.replace(" ", "_")[:256],
            )
            raise _ClosedError("the client certificate's subject names no live key")
        login = _Login(key_id, access.tenant, lambda: tenancy.access(key_id), None)
        try:
            await self._pace_login(login)
            self._count_connection(login)
        except _LoginRefusedError as exc:
            raise _ClosedError(str(exc)) from None
        self._begin_session(CERTIFICATE, login)
        log.info("event=gateway_authenticated peer=%s key=%s mechanism=SSL", self.peer, key_id)

    async def _refuse_sasl(self, header: RequestHeader, api: ApiSchema) -> None:
        """SASL on a session that signed in with a certificate: Kafka's SSL listener
        answers ILLEGAL_SASL_STATE and serves on."""
        if header.api_key == SASL_HANDSHAKE:
            body = api.response(error_code=E.illegal_sasl_state, mechanisms=())
        else:
            body = api.response(
                error_code=E.illegal_sasl_state,
                error_message="this listener authenticates with client certificates, not SASL",
                auth_bytes=b"",
                session_lifetime=timedelta(0),
            )
        await self._answer(header, api, body)

    async def _reauthenticate(self, header: RequestHeader, api: ApiSchema, body: Any) -> None:
        """KIP-368: a new login on an authenticated connection, same mechanism and principal."""
        mechanism = self._mechanism
        assert mechanism is not None
        if header.api_key != SASL_HANDSHAKE or header.api_version < 1:
            raise _ClosedError("re-authentication must start with SaslHandshake v1 or later")
        if body.mechanism != mechanism:
            await self._answer(
                header,
                api,
                api.response(error_code=E.unsupported_sasl_mechanism, mechanisms=(mechanism,)),
            )
            raise _ClosedError(f"re-authentication may not switch to {body.mechanism!r}")
        await self._answer(header, api, api.response(error_code=E.none, mechanisms=MECHANISMS))
        self._scram = None
        while True:
            header, api, body = self._decode(await self._read_login_frame(), _AUTH_APIS)
            if header.api_key != SASL_AUTHENTICATE:
                raise _ClosedError(
                    "re-authentication: SaslHandshake not followed by SaslAuthenticate"
                )
            try:
                login = await self._login(mechanism, body.auth_bytes)
                if isinstance(login, _Challenge):
                    await self._answer(header, api, _challenge(api, login.data))
                    continue
                if login.key_id != self.key_id or login.tenant != self._tenant():
                    raise _LoginRefusedError("re-authentication may not change the principal")
            except _LoginRefusedError as exc:
                await self._refuse(header, api, str(exc))
                raise _ClosedError("re-authentication failed") from None
            break
        lifetime = self._begin_session(mechanism, login)
        await self._answer(header, api, _authenticated(api, lifetime, login.server_final))
        log.info(
            "event=gateway_reauthenticated peer=%s key=%s session_s=%.0f",
            self.peer,
            login.key_id,
            lifetime.total_seconds(),
        )

    async def _pace_login(self, login: _Login) -> None:
        """Hold an accepted login until its tenant's connection creation rate lets it in
        (:mod:`shoal.gateway.connection_rate`), or refuse it when the hold would be too
        long. Held and refused logins are both counted in the limit-refusal metric: each
        is a connection the limit kept back. The authentication timeout is moved later by
        the hold, which is the gateway's doing, not the client's."""
        access = login.rights()
        rate = None if access is None else access.quotas.max_connection_rate
        services = self.services
        verdict = services.admission.login(login.tenant, rate)
        if rate is None or (verdict.wait_s <= 0 and not verdict.refused):
            return
        services.metrics.limit_refused(login.tenant, "connection_rate")
        if verdict.refused:
            log.info(
                "event=gateway_login_refused peer=%s tenant=%s reason=connection_rate wait_s=%.1f",
                self.peer,
                login.tenant,
                verdict.wait_s,
            )
            raise _LoginRefusedError(refusal_message(login.tenant, rate))
        deadline = self._auth_deadline
        if deadline is not None and (when := deadline.when()) is not None:
            deadline.reschedule(when + verdict.wait_s)
        await asyncio.sleep(verdict.wait_s)

    def _count_connection(self, login: _Login) -> None:
        """Count this connection against its tenant's limit, or refuse it when the tenant
        is at the limit over every replica (their counts as of the last round)."""
        access = login.rights()
        traffic = self.services.admission.traffic
        limit = None if access is None else access.quotas.max_connections
        if limit is not None:
            held = traffic.connections.get(login.tenant, 0)
            held += self.services.shares.connections_elsewhere(login.tenant)
            if held >= limit:
                self.services.metrics.limit_refused(login.tenant, "connections")
                raise _LoginRefusedError(
                    f"tenant {login.tenant!r} already has {held} connections, its limit"
                    " (maxConnections); close some or ask for a higher limit"
                )
        traffic.connected(login.tenant)
        self._counted_for = login.tenant

    def _tenant(self) -> str | None:
        access = self._rights()
        return None if access is None else access.tenant

    def _begin_session(self, mechanism: str, login: _Login) -> timedelta:
        """Adopt a login; returns the session lifetime to tell the client (0: no end)."""
        self.key_id = login.key_id
        self._mechanism = mechanism
        self._rights = login.rights
        if login.expires_at is None:
            self._session_ends = None
            return timedelta(0)
        remaining = max(login.expires_at - time.time(), _MIN_SESSION_S)
        self._session_ends = time.monotonic() + remaining
        return timedelta(seconds=remaining)

    async def _refuse(self, header: RequestHeader, api: ApiSchema, reason: str) -> None:
        # As Kafka: the answer at once, the close after the delay. A close right behind
        # the answer reaches some clients with it (kafka-python then reports a broken
        # socket instead of error 58).
        await self._answer(
            header,
            api,
            api.response(
                error_code=E.sasl_authentication_failed,
                error_message=f"Authentication failed: {reason}",
                auth_bytes=b"",
                session_lifetime=timedelta(0),
            ),
        )
        await asyncio.sleep(_FAILED_AUTH_DELAY_S)

    async def _send_bare(self, data: bytes) -> None:
        """A SASL token in a bare frame, as SaslHandshake v0 exchanges them."""
        slot: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        slot.set_result(_SIZE.pack(len(data)) + data)
        await self._slots.put(slot)

    async def _login(self, mechanism: str, message: bytes) -> _Login | _Challenge:
        """Check one client SASL message; the login, a challenge to send back
        (the exchange goes on), or :class:`_LoginRefusedError` saying why not."""
        turns = self.services.login_turns
        try:
            login = await self._check_login(mechanism, message)
        except _LoginRefusedError:
            self.services.metrics.authentication_failed("kafka")
            # The check may have waited (for a key's hash, which every login of that
            # key in the meantime waits on too): the refusal is encoded in a turn.
            self._login_turn = await turns.keep(self._login_turn)
            raise
        self._login_turn = await turns.keep(self._login_turn)
        return login

    async def _check_login(self, mechanism: str, message: bytes) -> _Login | _Challenge:
        tenancy = self.services.tenancy
        scram = _SCRAM_MECHANISMS.get(mechanism)
        if scram is not None:
            return await self._scram_step(scram, message)
        if mechanism != OAUTHBEARER:
            key_id = await self._check_credentials(message)
            access = None if key_id is None else tenancy.access(key_id)
            if key_id is None or access is None:
                raise _LoginRefusedError("invalid API key or secret")
            return _Login(key_id, access.tenant, lambda: tenancy.access(key_id), None)
        try:
            credentials = parse_oauthbearer(message)
            authority = self.services.tokens
            if authority is None:
                raise _LoginRefusedError("this gateway does not accept OAUTHBEARER")
            grant = await authority.grant(credentials.token)
        except (SaslError, TokenError) as exc:
            log.info(
                "event=gateway_auth_failed peer=%s mechanism=OAUTHBEARER reason=%s",
                self.peer,
                str(exc).replace(" ", "_"),
            )
            raise _LoginRefusedError(str(exc)) from None
        principal = grant.access.key_id
        if credentials.authzid is not None and credentials.authzid != principal:
            raise _LoginRefusedError("the authorization id must be the token's principal")
        return _Login(principal, grant.access.tenant, grant.current, grant.expires_at)

    async def _scram_step(self, mechanism: ScramMechanism, message: bytes) -> _Login | _Challenge:
        """One SCRAM round: client-first gets the server-first challenge, client-final
        the login (whose server-final proves the gateway knew the key)."""
        exchange, self._scram = self._scram, None
        try:
            if exchange is None:
                first = parse_client_first(mechanism, message)
                credential = await self._scram_credential(mechanism, first.username)
                self._scram = ScramExchange(first, credential)
                return _Challenge(self._scram.server_first)
            server_final = exchange.finish(message)
        except SaslError as exc:
            log.info(
                "event=gateway_auth_failed peer=%s mechanism=%s reason=%s",
                self.peer,
                mechanism.value,
                str(exc).replace(" ", "_"),
            )
            raise _LoginRefusedError(str(exc)) from None
        tenancy = self.services.tenancy
        key_id = exchange.username
        if tenancy.access(key_id) is None:
            # Made since the last poll, as for PLAIN: serve its first request.
            await tenancy.load()
        access = tenancy.access(key_id)
        if access is None:
            raise _LoginRefusedError("invalid API key or secret")
        return _Login(key_id, access.tenant, lambda: tenancy.access(key_id), None, server_final)

    async def _scram_credential(self, mechanism: ScramMechanism, key_id: str) -> ScramCredential:
        """The key's credential for ``mechanism``. An unknown or revoked key is refused
        now, before any proof, as Kafka refuses an unknown user (key ids are
        usernames, not secrets); so is a key too old to have SCRAM credentials."""
        key = await self.services.tenancy.find_key(key_id)
        if key is None or key.revoked:
            log.info(
                "event=gateway_auth_failed peer=%s mechanism=%s key=%s"
                " reason=unknown_or_revoked_key",
                self.peer,
                mechanism.value,
                key_id[:64],
            )
            raise _LoginRefusedError("invalid API key or secret")
        credential = key.scram_credential(mechanism)
        if credential is None:
            log.info(
                "event=gateway_auth_failed peer=%s mechanism=%s key=%s reason=key_predates_scram",
                self.peer,
                mechanism.value,
                key_id,
            )
            raise _LoginRefusedError(
                f"API key {key_id} predates SCRAM sign-in and has no {mechanism.value}"
                " credentials: rotate it (a new key has them) or sign in with PLAIN"
            )
        return credential

    def current_access(self) -> TenantAccess | None:
        """The principal's rights now; None once its key is revoked or tenant deleted."""
        return self._rights()

    async def _check_credentials(self, message: bytes) -> str | None:
        try:
            credentials = parse_plain(message)
        except SaslError as exc:
            log.info("event=gateway_auth_failed peer=%s reason=%s", self.peer, exc)
            return None
        tenancy = self.services.tenancy
        key = await tenancy.verifier.verify(credentials.username, credentials.password)
        if key is not None and tenancy.access(key.key_id) is None:
            # Made since the last poll: read the records now, so that the key's
            # first request is served rather than refused as unknown.
            await tenancy.load()
        if key is None or tenancy.access(key.key_id) is None:
            log.info(
                "event=gateway_auth_failed peer=%s key=%s reason=bad_credentials",
                self.peer,
                credentials.username[:64],
            )
            return None
        return key.key_id

    # -- serving -------------------------------------------------------------------

    def _decode(
        self, frame: bytes, supported: Mapping[int, tuple[int, int]]
    ) -> tuple[RequestHeader, ApiSchema, Any]:
        try:
            return decode_request(frame, dict(supported))
        except UnsupportedVersionError as exc:
            if exc.header.api_key == API_VERSIONS:
                raise _UnsupportedApiVersionsError(exc.header) from exc
            raise

    async def _serve(self) -> None:
        while True:
            await self._wait_out_throttle()
            await self._wait_for_request_quota()
            frame = await self._read_frame()
            # A fetch's throttle is known only when its answer comes back, which
            # may be after the next request was read: it waits all the same.
            await self._wait_out_throttle()
            # The request quota charges the loop's time spent on this request's own
            # code: decoding it here, then every slice of _handle and of its answer.
            watch = Stopwatch()
            watch.start()
            try:
                header, api, body = self._decode(frame, self.services.versions)
            except _UnsupportedApiVersionsError as exc:
                await self._answer_unsupported_api_versions(exc.header)
                continue
            finally:
                watch.stop()
            if header.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
                if self._mechanism == CERTIFICATE:
                    await self._refuse_sasl(header, api)
                else:
                    await self._reauthenticate(header, api, body)
                continue
            if self._session_ends is not None and time.monotonic() >= self._session_ends:
                raise _ClosedError("the session expired without re-authentication")
            if header.api_key == API_VERSIONS:
                await self._answer(header, api, self._api_versions(api, E.none))
                continue
            await timed(self._handle(frame, header, api, body, watch), watch)
            # What ran after the answer's throttle was decided (encoding the answer,
            # forwarding): owed all the same, reported with the next answer.
            self._charge_time(watch, answer=False)

    async def _handle(
        self, frame: bytes, header: RequestHeader, api: ApiSchema, body: Any, watch: Stopwatch
    ) -> None:
        assert self.key_id is not None
        services = self.services
        access = self.current_access()
        if access is None:
            raise _ClosedError("the key was revoked or its tenant deleted")
        if header.api_key == FETCH and self._fetch_in_flight is not None:
            # A fetch changes its session with its answer (fetch_session.py): the next
            # one is rewritten after it. Kafka's clients never send a broker two fetches
            # at once; one that does waits, rather than split its session's view.
            await asyncio.wait([self._fetch_in_flight])
        tracing = services.tracing
        trace = None if tracing is None else tracing.request(header, api, access.tenant)
        now = time.monotonic()
        throttle_ms, ticket = await self._admit_bytes(header.api_key, len(frame), access)
        ctx = RequestContext(
            access=access,
            api=api,
            lookups=self.listener.lookups,
            quota_store=services.quota_store,
            acl_store=services.acl_store,
            fetch_cap=None if ticket is None else ticket.reserved,
            tenant_keys=services.tenancy.tenant_keys,
            charge_mutations=mutation_charger(services, access),
            storage_refusal=storage_check(services, access),
            fetch_session=self._fetch_session,
        )
        _, rewrite = REWRITERS[header.api_key]
        try:
            step = await rewrite(ctx, body)
        except RefusedRequestError as exc:
            services.admission.fetched(ticket, 0)
            if trace is not None:
                trace.abandon(str(exc))
            raise
        if step.throttle_ms > 0:
            throttle_ms = max(throttle_ms, step.throttle_ms)
            self._mute(step.throttle_ms)
        if isinstance(step, Answer):
            services.admission.fetched(ticket, 0)
            if trace is not None:
                trace.end(step.response)
            services.metrics.answered(access.tenant, api, now, step.response)
            request_throttle_ms = self._charge_time(watch, answer=True)
            self._mute(request_throttle_ms)
            throttle_ms = max(throttle_ms, request_throttle_ms)
            await self._answer(header, api, _throttled(step.response, throttle_ms))
            return
        finish = services.metrics.observing(access.tenant, api, now, step.finish)
        upstream = await self._upstream_connection()
        client_id = forwarded_client_id(
            header.client_id or "", None if trace is None else trace.forwarding()
        )
        upstream.send(encode_request(api, header.correlation_id, client_id, step.request))
        if trace is not None and not step.expects_response:
            trace.end(None)
        if step.expects_response:
            slot: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            if header.api_key == FETCH:
                self._fetch_in_flight = slot
            if throttle_ms:
                finish = _then_throttle(finish, throttle_ms)
            self._pending.append(
                _Pending(slot, header, api, finish, access.tenant, ticket, watch, trace)
            )
            await self._slots.put(slot)
        await upstream.drain()

    async def _admit_bytes(
        self, api_key: int, nbytes: int, access: TenantAccess
    ) -> tuple[int, FetchTicket | None]:
        """Wait out the tenant's byte-rate quota before a Produce or Fetch is forwarded: a
        produce's throttle (the connection muted for it), a fetch's reservation."""
        services = self.services
        tenant = access.tenant
        if api_key == PRODUCE:
            quota = access.quotas.producer_byte_rate
            throttle_ms = await services.admission.produce(tenant, nbytes, quota)
            services.usage.produced(tenant, nbytes, throttle_ms)
            self._mute(throttle_ms)
            return throttle_ms, None
        if api_key == FETCH:
            return 0, await services.admission.fetch(tenant, access.quotas.consumer_byte_rate)
        return 0, None

    async def _wait_for_request_quota(self) -> None:
        """Hold the next read while the tenant owes more than a window of request time,
        on any of its connections (:mod:`shoal.gateway.request_quota`)."""
        access = self.current_access()
        if access is None:
            return
        tenant = access.tenant
        await self.services.admission.request_turn(tenant, access.quotas.request_percentage)

    def _charge_time(self, watch: Stopwatch, answer: bool) -> int:
        """Charge the request time ``watch`` holds; with ``answer``, the throttle the
        answer about to be encoded carries (0 otherwise: it is owed, and the next
        answer reports it)."""
        access = self.current_access()
        if access is None:
            return 0
        return charge_request(self.services, access, watch.take(), after_answer=not answer)

    async def _wait_out_throttle(self) -> None:
        delay = self._muted_until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _mute(self, throttle_ms: int) -> None:
        if throttle_ms > 0:
            self._muted_until = max(self._muted_until, time.monotonic() + throttle_ms / 1000)

    async def _upstream_connection(self) -> BrokerConnection:
        if self._upstream is not None:
            return self._upstream
        cluster = self.services.cluster
        if self.node_id is None:
            self._upstream = await _open_first_answering(cluster.bootstrap_candidates())
        else:
            target = cluster.brokers.get(self.node_id)
            if target is None:
                await cluster.refresh()
                target = cluster.brokers.get(self.node_id)
            if target is None:
                raise _ClosedError(f"broker {self.node_id} is not in the cluster")
            self._upstream = await BrokerConnection.open(target.host, target.port)
        self._upstream_reader = asyncio.create_task(self._read_upstream(self._upstream))
        return self._upstream

    async def _read_upstream(self, upstream: BrokerConnection) -> None:
        try:
            while True:
                frame = await upstream.read_frame()
                if not self._pending:
                    raise UpstreamError("broker sent an answer nobody asked for")
                pending = self._pending.popleft()
                watch = pending.watch
                watch.start()
                try:
                    body = self._answer_from_broker(pending, frame)
                    answer = b"".join(encode_response(pending.header, pending.api, body))  # type: ignore[arg-type]
                finally:
                    watch.stop()
                pending.slot.set_result(answer)
                self._charge_time(watch, answer=False)
                if pending.trace is not None:
                    pending.trace.end(body)
        except (UpstreamError, WireError) as exc:
            log.info("event=gateway_upstream_lost peer=%s error=%s", self.peer, exc)
            self.close()

    def _answer_from_broker(self, pending: _Pending, frame: bytes) -> Any:
        """The client's answer to ``pending`` from the broker's ``frame``: rewritten, and
        carrying the gateway's throttles (the fetch quota's, the request quota's)."""
        correlation_id, body = decode_response(pending.api, frame)
        if correlation_id != pending.header.correlation_id:
            raise UpstreamError("broker answered out of order")
        if pending.trace is not None:
            pending.trace.answered(body)
        body = pending.finish(body)
        if pending.header.api_key == FETCH:
            throttle_ms = self.services.admission.fetched(pending.fetch_ticket, len(frame))
            self.services.usage.fetched(pending.tenant, len(frame), throttle_ms)
            self._mute(throttle_ms)
            body = _throttled(body, throttle_ms)
        throttle_ms = self._charge_time(pending.watch, answer=True)
        self._mute(throttle_ms)
        return _throttled(body, throttle_ms)

    async def _answer_unsupported_api_versions(self, header: RequestHeader) -> None:
        # Answered with v0 and our versions, so the client can pick one (KIP-511).
        v0 = schema(API_VERSIONS, 0)
        await self._answer(header, v0, self._api_versions(v0, E.unsupported_version))

    def _api_versions(self, api: ApiSchema, code: ErrorCode) -> bytes:
        """The answer's body, encoded once per version offered (every connection asks,
        and building and encoding its sixty-odd entries took 100 us and more)."""
        services = self.services
        versions = services.versions
        cache = services.api_versions_answers
        if cache is None or cache[0] is not versions:
            cache = services.api_versions_answers = (versions, {})
        encoded = cache[1].get((api.version, code))
        if encoded is None:
            keys = tuple(
                api.make("ApiVersion", api_key=key, min_version=low, max_version=high)
                for key, (low, high) in sorted(versions.items())
            )
            body = api.response(
                error_code=code,
                api_keys=keys,
                throttle_time=timedelta(0),
                supported_features=(),
                finalized_features_epoch=-1,
                finalized_features=(),
                zk_migration_ready=False,
            )
            encoded = cache[1][api.version, code] = api.encode_body(body)
        return encoded


class _UnsupportedApiVersionsError(WireError):
    def __init__(self, header: RequestHeader) -> None:
        super().__init__("ApiVersions version not supported")
        self.header = header


def _authenticated(api: ApiSchema, lifetime: timedelta, auth_bytes: bytes = b"") -> Any:
    return api.response(
        error_code=E.none, error_message=None, auth_bytes=auth_bytes, session_lifetime=lifetime
    )


def _challenge(api: ApiSchema, data: bytes) -> Any:
    """A SaslAuthenticate answer that goes on with the exchange (no session yet)."""
    return api.response(
        error_code=E.none, error_message=None, auth_bytes=data, session_lifetime=timedelta(0)
    )


def _throttled(response: Any, throttle_ms: int) -> Any:
    if throttle_ms <= 0 or not any(f.name == "throttle_time" for f in dataclasses.fields(response)):
        return response
    ours = timedelta(milliseconds=throttle_ms)
    return dataclasses.replace(response, throttle_time=max(response.throttle_time, ours))


def _then_throttle(finish: Callable[[Any], Any], throttle_ms: int) -> Callable[[Any], Any]:
    return lambda response: _throttled(finish(response), throttle_ms)


async def _open_first_answering(candidates: list[BrokerAddress]) -> BrokerConnection:
    """A connection to the first candidate that accepts one."""
    if not candidates:
        raise _ClosedError("no broker is known yet")
    failures: list[str] = []
    for broker in candidates:
        try:
            return await BrokerConnection.open(broker.host, broker.port)
        except UpstreamError as exc:
            failures.append(str(exc))
    raise UpstreamError("; ".join(failures))
