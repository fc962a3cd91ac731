"""The lab's Dex: OIDC discovery, JWKS and RFC 8693 token exchange, answering as upstream Dex v2.41.1 does.

Deckhouse builds Dex from upstream and none of its patches touch token exchange. The differential test
(tests/lab/differential/test_dex_differential.py) sends the same requests to this and to upstream Dex built from
its Go module, and compares the answers; where they differ on purpose, lab/README.md lists it ("Where the lab's
Dex differs from upstream on purpose"), and the test checks exactly that. This follows upstream's `handleToken`,
`withClientFromStorage`, `handleTokenExchange` and `newIDToken`, in their order:
- only POST (else 400 `invalid_request` "method not allowed"); the form is read as Go's ParseForm reads it
  (lab/dex_request.py: a form it cannot parse is 400 `invalid_request`); `grant_type`, `client_id` and
  `client_secret` only from the body, the exchange's fields from the body or else the query;
- only the token-exchange grant is served; another `grant_type` is 400 `unsupported_grant_type`;
- the client authenticates with HTTP Basic, id and secret form-urlencoded (RFC 6749 §2.3.1) and URL-unescaped
  (a bad escape is 400 `invalid_request` "client_id improperly encoded"), or else with form
  `client_id`/`client_secret`; an unknown client or a wrong or missing secret is 401 `invalid_client`;
- `subject_token_type` must be the id_token or access_token type (else 400 `request_not_supported`), a missing
  `subject_token` is 400 `invalid_request`, a missing or unknown `connector_id` is 400 `invalid_request`
  "Requested connector does not exist.";
- the connector verifies the subject token (lab/dex_connector.py); any failure is 401 `access_denied` with no
  description;
- `requested_token_type` defaults to access_token; another type is 400 `request_not_supported`; an access
  token is the same signed token with an `at_hash` (of a random value, as Dex makes it);
- the issued token lives `id_tokens_valid_for` from now (user-authn's `idTokenTTL`, 10 minutes by default), NOT
  capped at the subject token's expiry;
- the form `audience` is never read. `aud` is the requesting client alone unless scopes
  `audience:server:client_id:<peer>` name peers: then `aud` is those peers plus the client, and `azp` the
  client. Each named peer must exist and list the client in its `trustedPeers`; otherwise the token cannot be
  made and the answer is 500 `server_error` (upstream's answer, not a 4xx);
- claims come only with their scope: `email` and `email_verified` with `email`, `name` and
  `preferred_username` with `profile`, `groups` with `groups` (left out when empty), `federated_claims` with
  `federated:id`; `sub` is opaque (`opaque_subject`, Dex's genSubject of user id and connector id).

Discovery is upstream's document for a Dex without a password connector; /keys serves the one signing key with
upstream's Cache-Control (the seconds to the next rotation, every 6 hours, at least 120). Unknown paths are 404
`404 page not found`, as Go's. The other endpoints discovery names are not served (404).

The rules are plain functions (`authenticate_client`, `exchange`, `id_token_claims`); `Dex` is the HTTP edge.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Mapping

from aiohttp import web
from jwcrypto import jwk, jwt

from lab.dex_claims import (CROSS_CLIENT_SCOPE, UntrustedPeer, audience, cross_client_peers, id_token_claims,
                            opaque_subject, trusts)
from lab.dex_connector import (SUBJECT_ALGS, TOKEN_TYPE_ID, Connector, Identity, SubjectTokenRefused,
                               token_identity, verify_subject_token)
from lab.dex_request import MAX_FORM_BYTES, Form, FormError, parse_basic_auth, parse_form, reads_body

# The names tests and user-authn take from here, wherever they are defined.
__all__ = ["CROSS_CLIENT_SCOPE", "GRANT_TOKEN_EXCHANGE", "SUBJECT_ALGS", "TOKEN_TYPE_ACCESS", "TOKEN_TYPE_ID",
           "Client", "Connector", "Dex", "ExchangeRequest", "Identity", "OAuthError", "audience",
           "authenticate_client", "cross_client_peers", "exchange", "opaque_subject", "parse_basic_auth", "trusts",
           "verify_subject_token"]

log = logging.getLogger(__name__)

GRANT_TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
TOKEN_TYPE_ACCESS = "urn:ietf:params:oauth:token-type:access_token"

# The grants upstream Dex advertises without a password connector (sorted, as it lists them); only token exchange
# is served here.
ADVERTISED_GRANTS = ("authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:device_code",
                     GRANT_TOKEN_EXCHANGE)
# user-authn's default idTokenTTL, which it passes to Dex as expiry.idTokens.
DEFAULT_ID_TOKENS_VALID_FOR = 600.0
# How long a stopping Dex waits for a client to answer its TLS close_notify before it aborts the connection.
CLOSE_GRACE = 2.0

# Dex's expiry.signingKeys default: /keys says to cache the keys until the next rotation, at least 2 minutes.
SIGNING_KEYS_ROTATE_EVERY = 6 * 3600
_KEYS_MIN_MAX_AGE = 120
# Go's strings.Fields splits on unicode.IsSpace, which is not Python's str.split (that also splits on \x1c-\x1f).
_GO_SPACE = re.compile("[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_JSON = "application/json"


class OAuthError(Exception):
    """An error answer of the token endpoint: RFC 6749 §5.2 error code, description and HTTP status."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = error
        self.description = description
        self.status = status

    def body(self) -> dict:
        out = {"error": self.error}
        if self.description:
            out["error_description"] = self.description
        return out


@dataclass(frozen=True)
class Client:
    """A static OAuth2 client of Dex."""

    id: str
    secret: str
    trusted_peers: tuple[str, ...] = ()


def _invalid_client() -> OAuthError:
    return OAuthError("invalid_client", "Invalid client credentials.", 401)


def authenticate_client(clients: Mapping[str, Client], basic: tuple[str, str] | None, form: Form) -> Client:
    """The client that authenticated, from Basic credentials or else the body's fields; `invalid_client`
    otherwise."""
    if basic is not None:
        client_id, client_secret = basic
    else:
        client_id, client_secret = form.post_value("client_id"), form.post_value("client_secret")
    client = clients.get(client_id)
    if client is None:
        raise _invalid_client()
    # Constant time: the secret is compared against attacker input.
    if not hmac.compare_digest(client.secret.encode("utf-8", "surrogateescape"),
                               client_secret.encode("utf-8", "surrogateescape")):
        raise _invalid_client()
    return client


@dataclass(frozen=True)
class ExchangeRequest:
    """The token-exchange form fields Dex reads (the form `audience` is not one of them)."""

    subject_token: str
    subject_token_type: str
    requested_token_type: str
    connector_id: str
    scopes: list[str] = field(default_factory=list)

    @classmethod
    def from_form(cls, form: Form) -> "ExchangeRequest":
        """From `r.Form`: the body's first value of each field, else the query's."""
        return cls(
            subject_token=form.value("subject_token"),
            subject_token_type=form.value("subject_token_type"),
            requested_token_type=form.value("requested_token_type") or TOKEN_TYPE_ACCESS,
            connector_id=form.value("connector_id"),
            scopes=[s for s in _GO_SPACE.split(form.value("scope")) if s],
        )


def exchange(
    clients: Mapping[str, Client], connectors: Mapping[str, Connector], client: Client, req: ExchangeRequest,
    issuer: str, now: float, valid_for: float = DEFAULT_ID_TOKENS_VALID_FOR,
) -> dict:
    """The claims of the token to issue for an authenticated client's exchange request, in Dex's order of checks."""
    if req.subject_token_type not in (TOKEN_TYPE_ID, TOKEN_TYPE_ACCESS):
        raise OAuthError("request_not_supported", "Invalid subject_token_type.")
    if not req.subject_token:
        raise OAuthError("invalid_request", "Missing subject_token")
    connector = connectors.get(req.connector_id)
    if connector is None:
        raise OAuthError("invalid_request", "Requested connector does not exist.")
    try:
        identity = token_identity(connector, req.subject_token_type, req.subject_token, now)
    except SubjectTokenRefused as e:
        log.info("connector %s: subject token refused: %s", connector.id, e)
        raise OAuthError("access_denied", "", 401) from None
    if req.requested_token_type not in (TOKEN_TYPE_ID, TOKEN_TYPE_ACCESS):
        raise OAuthError("request_not_supported", "Invalid requested_token_type.")
    try:
        return id_token_claims(clients, client.id, identity, connector.id, req.scopes, issuer, now, valid_for,
                               access_token=req.requested_token_type == TOKEN_TYPE_ACCESS)
    except UntrustedPeer as e:
        log.info("token exchange for client %s: %s; answering server_error as Dex does", client.id, e)
        raise OAuthError("server_error", "", 500) from None


def _json(doc, status: int = 200, headers: Mapping[str, str] = {}) -> web.Response:
    """JSON with Go's Content-Type (no charset parameter)."""
    return web.Response(body=json.dumps(doc).encode(), status=status, headers={"Content-Type": _JSON, **headers})


@web.middleware
async def _go_not_found(request: web.Request, handler) -> web.StreamResponse:
    """An unknown path answers as Go's http.NotFound."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.Response(body=b"404 page not found\n", status=404, headers={
            "Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"})


def _open(transport: asyncio.BaseTransport) -> bool:
    """Whether a transport's socket is still open (a closing TLS transport's stays open until the peer answers)."""
    sock = transport.get_extra_info("socket")
    return sock is not None and sock.fileno() != -1


class Dex:
    """Dex on 127.0.0.1 under `issuer`; clients and connectors are configured in-process (by user-authn).

    id_tokens_valid_for is Dex's expiry.idTokens in seconds (user-authn's idTokenTTL); it may be changed at run
    time through the attribute of the same name."""

    def __init__(self, issuer: str, ssl_context: ssl.SSLContext | None = None, *,
                 id_tokens_valid_for: float = DEFAULT_ID_TOKENS_VALID_FOR,
                 signing_key: tuple[jwk.JWK, float] | None = None) -> None:
        if id_tokens_valid_for <= 0:
            raise ValueError(f"id_tokens_valid_for must be a positive number of seconds, got {id_tokens_valid_for!r}")
        # The issuer exactly as configured (Deckhouse's ends with a slash: https://dex.<domain>/); it is the `iss`
        # of every token and the `issuer` of discovery, while endpoints hang off it without a doubled slash.
        self.issuer = issuer
        self._base = issuer.rstrip("/")
        # Dex's expiry.idTokens: how long every issued token lives, whatever the subject token's expiry.
        self.id_tokens_valid_for = float(id_tokens_valid_for)
        self._prefix = urllib.parse.urlsplit(self._base).path
        self._ssl = ssl_context
        # The signing key and when it was made: a new one, or an earlier Dex's of this issuer (`signing_key`), as
        # a restarted Dex reads it back from its storage; a kube-apiserver that cached the keys then still has it.
        self._key, self._key_made = signing_key or (
            jwk.JWK.generate(kty="RSA", size=2048, kid=secrets.token_hex(20), use="sig", alg="RS256"), time.time())
        self.clients: dict[str, Client] = {}
        self.connectors: dict[str, Connector] = {}
        self.exchange_calls = 0  # every token-exchange request, answered or refused
        self.tokens_issued = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self.started = asyncio.Event()

    # --- configuration (what Dex's config and user-authn's connectors set) ---

    def add_client(self, client_id: str, secret: str, trusted_peers: list[str] = ()) -> None:
        self.clients[client_id] = Client(client_id, secret, tuple(trusted_peers))

    def set_connector(self, connector_id: str, issuer: str, jwks: Mapping, username_prefix: str = "") -> None:
        self.connectors[connector_id] = Connector(connector_id, issuer, dict(jwks), username_prefix)

    def remove_connector(self, connector_id: str) -> None:
        self.connectors.pop(connector_id, None)

    @property
    def signing_key(self) -> tuple[jwk.JWK, float]:
        """The signing key and when it was made (`signing_key` of the next Dex of this issuer)."""
        return self._key, self._key_made

    def jwks(self) -> dict:
        return {"keys": [self._key.export_public(as_dict=True)]}

    def discovery_document(self) -> dict:
        i = self._base
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{i}/auth",
            "token_endpoint": f"{i}/token",
            "jwks_uri": f"{i}/keys",
            "userinfo_endpoint": f"{i}/userinfo",
            "device_authorization_endpoint": f"{i}/device/code",
            "introspection_endpoint": f"{i}/token/introspect",
            "grant_types_supported": list(ADVERTISED_GRANTS),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256", "plain"],
            "scopes_supported": ["openid", "email", "groups", "profile", "offline_access"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "claims_supported": [
                "iss", "sub", "aud", "iat", "exp", "email", "email_verified", "locale", "name",
                "preferred_username", "at_hash",
            ],
        }

    def sign(self, claims: dict) -> str:
        token = jwt.JWT(header={"alg": "RS256", "kid": self._key.kid}, claims=claims)
        token.make_signed_token(self._key)
        return token.serialize()

    # --- HTTP edge ---

    def _app(self) -> web.Application:
        # Go's ParseForm reads MAX_FORM_BYTES of a form and refuses more; aiohttp reads no more than one byte over.
        app = web.Application(client_max_size=MAX_FORM_BYTES + 1, middlewares=[_go_not_found])
        p = self._prefix
        # Dex's routes take any method; only /token refuses all but POST.
        app.router.add_route("*", f"{p}/.well-known/openid-configuration", self._discovery)
        app.router.add_route("*", f"{p}/keys", self._keys)
        app.router.add_route("*", f"{p}/token", self._token)
        return app

    async def _discovery(self, request: web.Request) -> web.Response:
        return _json(self.discovery_document())

    async def _keys(self, request: web.Request) -> web.Response:
        max_age = max(_KEYS_MIN_MAX_AGE, int(self._key_made + SIGNING_KEYS_ROTATE_EVERY - time.time()))
        return _json(self.jwks(), headers={"Cache-Control": f"max-age={max_age}, must-revalidate"})

    @staticmethod
    def _error(e: OAuthError) -> web.Response:
        return _json(e.body(), status=e.status)

    async def _form(self, request: web.Request) -> Form:
        """The request's form as Go's ParseForm makes it; OAuthError invalid_request where that fails."""
        content_type = request.headers.get("Content-Type")
        try:
            body = None
            if reads_body(content_type):
                try:
                    body = await request.read()
                except web.HTTPRequestEntityTooLarge:
                    body = None
                if body is None or len(body) > MAX_FORM_BYTES:
                    raise FormError("http: POST too large")
            return parse_form(content_type, body, request.rel_url.raw_query_string)
        except FormError as e:
            log.info("token request refused: the form cannot be parsed: %s", e)
            raise OAuthError("invalid_request", "") from None

    async def _token(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return self._error(OAuthError("invalid_request", "method not allowed"))
        try:
            form = await self._form(request)
        except OAuthError as e:
            return self._error(e)
        if form.post_value("grant_type") != GRANT_TOKEN_EXCHANGE:
            return self._error(OAuthError("unsupported_grant_type", ""))
        self.exchange_calls += 1
        now = time.time()
        try:
            try:
                basic = parse_basic_auth(request.headers.get("Authorization"))
            except FormError as e:
                raise OAuthError("invalid_request", str(e)) from None
            client = authenticate_client(self.clients, basic, form)
            req = ExchangeRequest.from_form(form)
            claims = exchange(self.clients, self.connectors, client, req, self.issuer, now, self.id_tokens_valid_for)
        except OAuthError as e:
            log.info("token exchange refused: %s", e)
            return self._error(e)
        self.tokens_issued += 1
        log.info("token exchange for client %s via connector %s, scopes %s", client.id, req.connector_id,
                 " ".join(req.scopes))
        body = {
            "access_token": self.sign(claims),
            "issued_token_type": req.requested_token_type,
            "token_type": "bearer",
        }
        expires_in = int(now + self.id_tokens_valid_for - time.time())
        if expires_in:
            body["expires_in"] = expires_in   # omitted when zero, as Dex's omitempty
        return _json(body, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})

    async def start(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        """Serve; a restart after `stop()` binds the same port again so the resolver map stays true."""
        if self._runner is not None:
            return
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, self.port if port is None else port, ssl_context=self._ssl, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = runner.addresses[0][1]
        self._runner = runner
        self.started.set()

    async def stop(self) -> None:
        """Stop serving and return once every connection is closed. A client may hold one open (kube-apiserver
        keeps its connection to its issuer, and outlives this Dex when its control plane is kept for the next
        lab cluster): it is sent TLS close_notify and given CLOSE_GRACE seconds to answer, then aborted."""
        runner, self._runner = self._runner, None
        self.started.clear()
        if runner is None:
            return
        for site in list(runner.sites):
            await site.stop()
        transports = [h.transport for h in (runner.server.connections if runner.server is not None else [])
                      if h.transport is not None]
        await runner.cleanup()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_GRACE
        # Bounded poll: a closing TLS connection says nothing when the peer's close_notify came.
        while any(map(_open, transports)) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        left = [t for t in transports if _open(t)]
        for transport in left:
            transport.abort()
        if left:
            await asyncio.sleep(0)  # the aborted sockets close in the loop's next round

    @property
    def running(self) -> bool:
        return self._runner is not None
