"""OAuth 2.0 for both of the gateway's doors.

The gateway is an authorization server for the client-credentials grant: an
API key id and secret buy a short-lived JWT at ``POST /oauth2/token``, and
that JWT is accepted as an HTTP Bearer token and as a SASL/OAUTHBEARER login
on the Kafka door. Tokens of one external issuer (a company's identity
provider) are accepted too, naming the tenant and principal in claims.

Layout, pure logic apart from I/O:

* :mod:`.keys` - the signing key ring (active key, retired keys kept until
  their tokens expire) and its rotation rule. Pure.
* :mod:`.tokens` - issuing and verifying JWTs, the claims we write and
  check, the errors a caller is shown. Pure.
* :mod:`.keystore` - the key ring in etcd (create-if-absent, rotation by
  compare-and-swap) and the loop that keeps each replica's copy fresh.
* :mod:`.external` - an external issuer's JWKS over HTTP, cached.
* :mod:`.authority` - :class:`~.authority.GatewayTokens`, the gateway's
  token authority: issues tokens and turns a token into tenant rights.

The JOSE work (JWS, JWK, JWT claims) is done by joserfc, the Authlib
project's JOSE library: Authlib 1.6+ deprecates its own ``authlib.jose`` in
its favour.
"""
