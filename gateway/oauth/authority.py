"""The gateway's token authority: issues its own tokens, and turns any trusted
token into the rights of a tenant's principal.

Which verifier a token gets is chosen by its (not yet trusted) ``iss``: the
gateway's own issuer URL, or the one configured external issuer; any other
issuer is refused by name. Trust comes only from the signature check that
follows, against that issuer's keys.

Own tokens name an API key (``sub``): their rights are that key's, read from
the tenancy records at every use, so a revoked key's tokens stop working
within a tenancy poll, like its SASL/PLAIN logins and API-key requests.

External tokens name a tenant and a principal in configured claims. The
tenant must exist; the principal's rights are the tenant's ACL bindings for
that principal (bindings name a key id or ``*``, so an external principal is
matched by name like a key id). The external issuer is trusted to say which
tenant a token belongs to: configure only an identity provider that the
platform team controls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shoal.gateway.access import TenantAccess
from shoal.gateway.config import GatewayConfig
from shoal.gateway.http.auth import TokenError, TokenGrant
from shoal.gateway.oauth.external import ExternalIssuer, JwksCache, fetch_jwks
from shoal.gateway.oauth.keystore import DEFAULT_REFRESH_S, KeyRingKeeper, SigningKeyStore
from shoal.gateway.oauth.tokens import (
    ASYMMETRIC,
    TENANT_CLAIM,
    IssuedToken,
    TokenPolicy,
    UnknownKeyError,
    expires_at,
    issue_token,
    peek,
    verify_token,
)
from shoal.gateway.tenancy_view import TenancyView

log = logging.getLogger(__name__)


def gateway_tokens(
    config: GatewayConfig,
    tenancy: TenancyView,
    store: SigningKeyStore,
    clock: Callable[[], float],
) -> GatewayTokens:
    """The authority a gateway's configuration describes; ``start()`` it before use."""
    policy = TokenPolicy(
        issuer=config.oauth_issuer_url(),
        audience=config.oauth_audience,
        lifetime_s=config.oauth_token_lifetime_s,
        leeway_s=config.oauth_leeway_s,
    )
    # A retired key signs no more tokens, but a replica may sign with it until its
    # next refresh, and those tokens live a lifetime (plus leeway) from then.
    retain_s = config.oauth_token_lifetime_s + DEFAULT_REFRESH_S + config.oauth_leeway_s
    keeper = KeyRingKeeper(store, clock, config.oauth_key_rotation_s, retain_s)
    external = None
    external_keys = None
    if config.oauth_external_issuer and config.oauth_external_jwks_url:
        external = ExternalIssuer(
            issuer=config.oauth_external_issuer,
            jwks_url=config.oauth_external_jwks_url,
            audience=config.oauth_external_audience or config.oauth_audience,
            tenant_claim=config.oauth_external_tenant_claim,
            principal_claim=config.oauth_external_principal_claim,
        )
        url = external.jwks_url
        external_keys = JwksCache(lambda: fetch_jwks(url), clock)
    return GatewayTokens(policy, keeper, tenancy, clock, external, external_keys)


class InvalidClientError(Exception):
    """The client's credentials do not buy a token (RFC 6749 ``invalid_client``)."""


class GatewayTokens:
    def __init__(
        self,
        policy: TokenPolicy,
        keeper: KeyRingKeeper,
        tenancy: TenancyView,
        clock: Callable[[], float],
        external: ExternalIssuer | None = None,
        external_keys: JwksCache | None = None,
    ) -> None:
        self.policy = policy
        self.keeper = keeper
        self.tenancy = tenancy
        self.clock = clock
        self.external = external
        self.external_keys = external_keys

    async def start(self) -> None:
        """Read (or make) the signing keys; rotate them if due."""
        await self.keeper.start()
        log.info(
            "event=oauth_ready issuer=%s kid=%s external=%s",
            self.policy.issuer,
            self.keeper.ring.active.kid,
            self.external.issuer if self.external else "-",
        )

    # -- issuing ---------------------------------------------------------------------

    async def issue(self, client_id: str, client_secret: str, scope: str | None) -> IssuedToken:
        """A token for an API key, checked as the Kafka door checks SASL/PLAIN."""
        tenancy = self.tenancy
        key = await tenancy.verifier.verify(client_id, client_secret)
        if key is not None and tenancy.access(key.key_id) is None:
            # Made since the last poll: read the records now, as the Kafka door does.
            await tenancy.load()
        access = None if key is None else tenancy.access(key.key_id)
        if access is None:
            log.info("event=oauth_token_refused client=%s", client_id[:64])
            raise InvalidClientError("invalid client id or secret, or the key was revoked")
        issued = issue_token(
            self.keeper.ring.active,
            self.policy,
            subject=access.key_id,
            tenant=access.tenant,
            now=self.clock(),
            scope=scope,
        )
        log.info(
            "event=oauth_token_issued tenant=%s key=%s kid=%s expires_in=%d",
            access.tenant,
            access.key_id,
            self.keeper.ring.active.kid,
            issued.expires_in,
        )
        return issued

    def jwks(self) -> dict[str, Any]:
        return self.keeper.ring.jwks()

    # -- checking --------------------------------------------------------------------

    async def access(self, token: str) -> TenantAccess:
        return (await self.grant(token)).access

    async def grant(self, token: str) -> TokenGrant:
        claimed = peek(token)
        if claimed.issuer == self.policy.issuer:
            return await self._own(token, claimed.kid)
        if self.external is not None and claimed.issuer == self.external.issuer:
            return await self._foreign(token, claimed.kid, self.external)
        raise TokenError("the token's issuer is not trusted")

    async def _own(self, token: str, kid: str | None) -> TokenGrant:
        policy = self.policy

        def verify() -> Any:
            return verify_token(
                token,
                self.keeper.verification_keys,
                issuer=policy.issuer,
                audience=policy.audience,
                now=int(self.clock()),
                leeway_s=policy.leeway_s,
                required=("sub", TENANT_CLAIM),
            )

        try:
            claims = verify()
        except UnknownKeyError:
            # Signed by a key another replica made moments ago?
            if kid is None or not await self.keeper.reload_for(kid):
                raise
            claims = verify()
        key_id = str(claims["sub"])
        tenancy = self.tenancy
        access = tenancy.access(key_id)
        if access is None and key_id not in tenancy.snapshot.keys:
            # A key made since our last poll, its token issued by another replica.
            await tenancy.load()
            access = tenancy.access(key_id)
        if access is None:
            raise TokenError("the token's API key was revoked or its tenant deleted")
        if access.tenant != claims[TENANT_CLAIM]:
            raise TokenError("the token's tenant is not its key's tenant")
        return TokenGrant(access, expires_at(claims), lambda: tenancy.access(key_id))

    async def _foreign(self, token: str, kid: str | None, issuer: ExternalIssuer) -> TokenGrant:
        assert self.external_keys is not None
        claims = verify_token(
            token,
            await self.external_keys.keys(kid),
            issuer=issuer.issuer,
            audience=issuer.audience,
            now=int(self.clock()),
            leeway_s=self.policy.leeway_s,
            algorithms=ASYMMETRIC,
            required=(issuer.tenant_claim, issuer.principal_claim),
        )
        tenant = str(claims[issuer.tenant_claim])
        principal = str(claims[issuer.principal_claim])
        tenancy = self.tenancy
        access = tenancy.access_for(tenant, principal)
        if access is None:
            # A tenant made since our last poll? Only validly signed tokens get here.
            await tenancy.load()
            access = tenancy.access_for(tenant, principal)
        if access is None:
            raise TokenError(f"the token's tenant {tenant[:63]!r} does not exist")
        return TokenGrant(access, expires_at(claims), lambda: tenancy.access_for(tenant, principal))
