"""The lab's Dex: OIDC discovery, JWKS and RFC 8693 token exchange, answering exactly as upstream Dex does.

Deckhouse builds Dex from upstream and none of its patches touch token exchange, so this stand-in follows
upstream's `handleToken`, `withClientFromStorage`, `handleTokenExchange` and `newIDToken`, in their order:
- only POST (else 400 `invalid_request` "method not allowed"); an unknown `grant_type` is 400
  `unsupported_grant_type`;
- the client authenticates with HTTP Basic, id and secret form-urlencoded (RFC 6749 §2.3.1) and URL-unescaped
  (a bad escape is 400 `invalid_request` "client_id improperly encoded"), or else with form
  `client_id`/`client_secret`; an unknown client or a wrong or missing secret is 401 `invalid_client`;
- `subject_token_type` must be the id_token or access_token type (else 400 `request_not_supported`), a missing
  `subject_token` is 400 `invalid_request`, a missing or unknown `connector_id` is 400 `invalid_request`
  "Requested connector does not exist.";
- the connector verifies the subject token; any failure is 401 `access_denied` with no description;
- `requested_token_type` defaults to access_token; another type is 400 `request_not_supported`;
- the issued token lives `id_tokens_valid_for` from now (user-authn's `idTokenTTL`, 10 minutes by default), NOT
  capped at the subject token's expiry;
- the form `audience` is never read. `aud` is the requesting client alone unless scopes
  `audience:server:client_id:<peer>` name peers: then `aud` is those peers plus the client, and `azp` the
  client. Each named peer must exist and list the client in its `trustedPeers`; otherwise the token cannot be
  made and the answer is 500 `server_error` (upstream's answer, not a 4xx);
- claims come only with their scope: `email` and `email_verified` with `email`, `name` and
  `preferred_username` with `profile`, `groups` with `groups` (left out when empty), `federated_claims` with
  `federated:id`; `sub` is opaque (`opaque_subject`, Dex's genSubject of user id and connector id).

Dex has no username prefix and no inline-JWKS connector. The connector here is the one the peering module
assumes user-authn will add for a `TokenExchangeProvider` (docs/user-authn-contract.md): it verifies a subject
id_token against the provider's inline JWKS and issuer (issuer, `exp`, `nbf` with go-oidc's 5 minutes of leeway,
signature; the audience is NOT checked, as Dex's `SkipClientIDCheck`), and names the exchanged identity:

    email              = usernamePrefix + the subject token's `sub`
    email_verified     = true
    name               = usernamePrefix + `sub`
    preferred_username = `sub`
    groups             = none

An access_token subject token is refused (`access_denied`): upstream's connectors verify one only through the
issuer's userinfo endpoint, which a provider given as inline JWKS does not have.

The rules are plain functions (`authenticate_client`, `token_identity`, `exchange`); `Dex` is the HTTP edge.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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
from jwcrypto.common import JWException

log = logging.getLogger(__name__)

GRANT_TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
TOKEN_TYPE_ID = "urn:ietf:params:oauth:token-type:id_token"
TOKEN_TYPE_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
CROSS_CLIENT_SCOPE = "audience:server:client_id:"
SCOPE_EMAIL = "email"
SCOPE_PROFILE = "profile"
SCOPE_GROUPS = "groups"
SCOPE_FEDERATED_ID = "federated:id"

# The grants Dex advertises; only token exchange is served, the others answer as an unsupported grant would.
_SUPPORTED_GRANTS = (GRANT_TOKEN_EXCHANGE,)
# Algorithms go-oidc accepts by default on an upstream token, plus ES256 which ServiceAccount issuers may use.
_SUBJECT_ALGS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256"]
# go-oidc allows this much clock skew on `nbf` and none on `exp`.
_NBF_LEEWAY = 300
# user-authn's default idTokenTTL, which it passes to Dex as expiry.idTokens.
DEFAULT_ID_TOKENS_VALID_FOR = 600.0
# Go's url.QueryUnescape refuses a `%` not followed by two hex digits.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


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


@dataclass(frozen=True)
class Identity:
    """What a connector says about the user behind a subject token (Dex's connector.Identity)."""

    user_id: str
    username: str
    preferred_username: str
    email: str
    email_verified: bool
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Connector:
    """The assumed TokenExchangeProvider connector: whose tokens it accepts and how it names their subjects."""

    id: str
    issuer: str
    jwks: Mapping  # a JWK Set as a dict: {"keys": [...]}
    username_prefix: str = ""

    def identity(self, subject: Mapping) -> Identity:
        """The exchanged identity of a verified subject token, per the user-authn contract (module docstring)."""
        sub = subject["sub"]
        name = self.username_prefix + sub
        return Identity(user_id=sub, username=name, preferred_username=sub, email=name, email_verified=True)


def _invalid_client() -> OAuthError:
    return OAuthError("invalid_client", "Invalid client credentials.", 401)


def _query_unescape(value: str, what: str) -> str:
    """Go's url.QueryUnescape: `+` is a space, `%XX` a byte; a broken escape is the client's error."""
    if _BAD_ESCAPE.search(value):
        raise OAuthError("invalid_request", f"{what} improperly encoded")
    return urllib.parse.unquote_to_bytes(value.replace("+", " ")).decode("utf-8", "surrogateescape")


def parse_basic_auth(header: str | None) -> tuple[str, str] | None:
    """HTTP Basic credentials, URL-unescaped as Dex does (RFC 6749 §2.3.1), or None when there are none.

    None (no Basic credentials: the form is read instead) follows Go's Request.BasicAuth: another scheme, bad
    base64 or no colon. A credential with a broken %-escape raises 400 `invalid_request`.
    """
    if not header or len(header) < 6 or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:], validate=True).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError):
        return None
    if ":" not in decoded:
        return None
    user, _, password = decoded.partition(":")
    return _query_unescape(user, "client_id"), _query_unescape(password, "client_secret")


def authenticate_client(clients: Mapping[str, Client], basic: tuple[str, str] | None, form: Mapping[str, str]) -> Client:
    """The client that authenticated, from Basic credentials or else the form; `invalid_client` otherwise."""
    if basic is not None:
        client_id, client_secret = basic
    else:
        client_id, client_secret = form.get("client_id", ""), form.get("client_secret", "")
    client = clients.get(client_id)
    if client is None:
        raise _invalid_client()
    # Constant time: the secret is compared against attacker input.
    if not hmac.compare_digest(client.secret.encode("utf-8", "surrogateescape"),
                               client_secret.encode("utf-8", "surrogateescape")):
        raise _invalid_client()
    return client


def verify_subject_token(connector: Connector, token: str, now: float) -> dict:
    """The subject token's claims if the connector's keys signed it, its issuer matches and it is valid now.

    The audience is deliberately not checked: Dex does not (SkipClientIDCheck), and the gateway checks it
    before it calls. Raises `access_denied` (401), without saying why to the caller; the reason goes to the log.
    """
    def denied(why: str) -> OAuthError:
        log.info("connector %s: subject token refused: %s", connector.id, why)
        return OAuthError("access_denied", "", 401)

    try:
        keys = jwk.JWKSet.from_json(json.dumps(dict(connector.jwks)))
    except (JWException, ValueError, TypeError) as e:
        raise denied(f"connector keys are not a JWK Set ({e})") from None
    try:
        verified = jwt.JWT(jwt=token, key=keys, algs=_SUBJECT_ALGS, expected_type="JWS", check_claims=False)
        claims = json.loads(verified.claims)
    except (JWException, ValueError, TypeError) as e:
        raise denied(f"signature not verified with the connector's keys ({type(e).__name__})") from None
    if not isinstance(claims, dict):
        raise denied("claims are not a JSON object")
    if claims.get("iss") != connector.issuer:
        raise denied(f"issuer {claims.get('iss')!r} is not the connector's {connector.issuer!r}")
    exp = claims.get("exp")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp < now:
        raise denied("token expired or carries no exp")
    nbf = claims.get("nbf")
    if isinstance(nbf, (int, float)) and not isinstance(nbf, bool) and nbf > now + _NBF_LEEWAY:
        raise denied("token not valid yet")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise denied("token has no sub")
    return claims


def token_identity(connector: Connector, subject_token_type: str, token: str, now: float) -> Identity:
    """The connector's TokenIdentity: verify the subject token, then name its user; `access_denied` otherwise."""
    if subject_token_type != TOKEN_TYPE_ID:
        log.info("connector %s: subject token refused: only id_token subject tokens can be verified against "
                 "inline keys (an access_token needs the issuer's userinfo endpoint)", connector.id)
        raise OAuthError("access_denied", "", 401)
    return connector.identity(verify_subject_token(connector, token, now))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def opaque_subject(user_id: str, connector_id: str) -> str:
    """Dex's `sub`: base64url (unpadded) of the protobuf message {1: user_id, 2: connector_id}."""
    msg = b""
    for tag, value in ((0x0A, user_id), (0x12, connector_id)):
        raw = value.encode()
        msg += bytes([tag]) + _varint(len(raw)) + raw
    return base64.urlsafe_b64encode(msg).rstrip(b"=").decode()


def cross_client_peers(scopes: list[str]) -> list[str]:
    """The peers named by `audience:server:client_id:<peer>` scopes, in order, repeats kept (as Dex does)."""
    return [s[len(CROSS_CLIENT_SCOPE):] for s in scopes if s.startswith(CROSS_CLIENT_SCOPE)]


def audience(client_id: str, scopes: list[str]) -> list[str]:
    """Dex's getAudience: the requesting client alone, or the named peers plus the client."""
    peers = cross_client_peers(scopes)
    if not peers:
        return [client_id]
    return peers if client_id in peers else peers + [client_id]


def trusts(clients: Mapping[str, Client], client_id: str, peer_id: str) -> bool:
    """Dex's validateCrossClientTrust: a client trusts itself; a peer must exist and list the client."""
    if peer_id == client_id:
        return True
    peer = clients.get(peer_id)
    return peer is not None and client_id in peer.trusted_peers


@dataclass(frozen=True)
class ExchangeRequest:
    """The token-exchange form fields Dex reads (the form `audience` is not one of them)."""

    subject_token: str
    subject_token_type: str
    requested_token_type: str
    connector_id: str
    scopes: list[str] = field(default_factory=list)

    @classmethod
    def from_form(cls, form: Mapping[str, str]) -> "ExchangeRequest":
        return cls(
            subject_token=form.get("subject_token", ""),
            subject_token_type=form.get("subject_token_type", ""),
            requested_token_type=form.get("requested_token_type", "") or TOKEN_TYPE_ACCESS,
            connector_id=form.get("connector_id", ""),
            scopes=form.get("scope", "").split(),
        )


def id_token_claims(clients: Mapping[str, Client], client: Client, identity: Identity, connector_id: str,
                    scopes: list[str], issuer: str, now: float, valid_for: float) -> dict:
    """Dex's newIDToken: the claims by scope; an untrusted cross-client scope is an error (500 server_error)."""
    expiry = now + valid_for
    claims: dict = {
        "iss": issuer,
        "sub": opaque_subject(identity.user_id, connector_id),
        "exp": int(expiry),
        "iat": int(now),
    }
    for scope in scopes:
        if scope == SCOPE_EMAIL:
            if identity.email:
                claims["email"] = identity.email
            claims["email_verified"] = identity.email_verified
        elif scope == SCOPE_GROUPS:
            if identity.groups:
                claims["groups"] = list(identity.groups)
        elif scope == SCOPE_PROFILE:
            if identity.username:
                claims["name"] = identity.username
            if identity.preferred_username:
                claims["preferred_username"] = identity.preferred_username
        elif scope == SCOPE_FEDERATED_ID:
            claims["federated_claims"] = {"connector_id": connector_id, "user_id": identity.user_id}
        elif scope.startswith(CROSS_CLIENT_SCOPE):
            peer = scope[len(CROSS_CLIENT_SCOPE):]
            if not trusts(clients, client.id, peer):
                log.info("token exchange for client %s: peer %r does not trust it (its trustedPeers lack %s); "
                         "answering server_error as Dex does", client.id, peer, client.id)
                raise OAuthError("server_error", "", 500)
    aud = audience(client.id, scopes)
    # Dex writes a single audience as a string.
    claims["aud"] = aud[0] if len(aud) == 1 else aud
    if len(aud) > 1:
        claims["azp"] = client.id
    return claims


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
    identity = token_identity(connector, req.subject_token_type, req.subject_token, now)
    if req.requested_token_type not in (TOKEN_TYPE_ID, TOKEN_TYPE_ACCESS):
        raise OAuthError("request_not_supported", "Invalid requested_token_type.")
    return id_token_claims(clients, client, identity, connector.id, req.scopes, issuer, now, valid_for)


class Dex:
    """Dex on 127.0.0.1 under `issuer`; clients and connectors are configured in-process (by user-authn).

    id_tokens_valid_for is Dex's expiry.idTokens in seconds (user-authn's idTokenTTL); it may be changed at run
    time through the attribute of the same name."""

    def __init__(self, issuer: str, ssl_context: ssl.SSLContext | None = None, *,
                 id_tokens_valid_for: float = DEFAULT_ID_TOKENS_VALID_FOR) -> None:
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
        self._key = jwk.JWK.generate(kty="RSA", size=2048, kid=secrets.token_hex(20), use="sig", alg="RS256")
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

    def add_trusted_peer(self, client_id: str, peer_id: str) -> None:
        """Let `peer_id` ask for tokens with audience `client_id` (add it to that client's trustedPeers)."""
        client = self.clients.get(client_id)
        if client is None:
            raise KeyError(f"Dex has no client {client_id!r}; add it before trusting peers for it")
        if peer_id not in client.trusted_peers:
            self.clients[client_id] = Client(client.id, client.secret, client.trusted_peers + (peer_id,))

    def set_connector(self, connector_id: str, issuer: str, jwks: Mapping, username_prefix: str = "") -> None:
        self.connectors[connector_id] = Connector(connector_id, issuer, dict(jwks), username_prefix)

    def remove_connector(self, connector_id: str) -> None:
        self.connectors.pop(connector_id, None)

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
            "grant_types_supported": list(_SUPPORTED_GRANTS),
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
        app = web.Application()
        p = self._prefix
        app.router.add_get(f"{p}/.well-known/openid-configuration", self._discovery)
        app.router.add_get(f"{p}/keys", self._keys)
        app.router.add_route("*", f"{p}/token", self._token)
        return app

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response(self.discovery_document())

    async def _keys(self, request: web.Request) -> web.Response:
        return web.json_response(self.jwks(), headers={"Cache-Control": "max-age=60, must-revalidate"})

    @staticmethod
    def _error(e: OAuthError) -> web.Response:
        return web.json_response(e.body(), status=e.status)

    async def _token(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return self._error(OAuthError("invalid_request", "method not allowed"))
        form = await request.post()
        fields: dict[str, str] = {}
        for k, v in form.items():
            if isinstance(v, str):
                fields.setdefault(k, v)   # the first value of a repeated field, as Go's Form.Get
        if fields.get("grant_type", "") not in _SUPPORTED_GRANTS:
            return self._error(OAuthError("unsupported_grant_type", ""))
        self.exchange_calls += 1
        now = time.time()
        try:
            client = authenticate_client(self.clients, parse_basic_auth(request.headers.get("Authorization")), fields)
            req = ExchangeRequest.from_form(fields)
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
        return web.json_response(body, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})

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
        runner, self._runner = self._runner, None
        self.started.clear()
        if runner is not None:
            await runner.cleanup()

    @property
    def running(self) -> bool:
        return self._runner is not None
