"""The lab's Dex: OIDC discovery, JWKS and RFC 8693 token exchange, answering as Dex does.

Deckhouse's Dex exchanges a peer's ServiceAccount token for an ID token that kube-apiserver accepts. What this
stand-in keeps from Dex, because the gateway depends on it:
- the token endpoint is `<issuer>/token`, discovery is `<issuer>/.well-known/openid-configuration`, keys are
  `<issuer>/keys`;
- the client authenticates with HTTP Basic (URL-encoded id and secret) or form `client_id`/`client_secret`;
  a missing or wrong secret and an unknown client are all `invalid_client` with 401;
- `connector_id` is required; a missing or unknown one is `invalid_request` "Requested connector does not exist.";
- the subject token is verified with the connector's keys and issuer, and its expiry; its audience is NOT checked;
  a token that fails verification is `access_denied` with 401 (Dex's answer, see README);
- the audience asked for (form `audience` or scope `audience:server:client_id:<id>`) must be the requesting
  client itself or a client that lists it among its trusted peers (Dex's cross-client trust).
The rules are plain functions (`authenticate_client`, `verify_subject_token`, `exchange`); `Dex` is the HTTP edge.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
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

# The grants Dex advertises; only token exchange is served, the others answer as an unsupported grant would.
_SUPPORTED_GRANTS = (GRANT_TOKEN_EXCHANGE,)
# Algorithms go-oidc accepts by default on an upstream token, plus ES256 which ServiceAccount issuers may use.
_SUBJECT_ALGS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256"]
# go-oidc allows this much clock skew on `nbf` and none on `exp`.
_NBF_LEEWAY = 300
MAX_TOKEN_LIFETIME = 3600


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
class Connector:
    """A token-exchange connector: whose tokens it accepts and how it names their subjects."""

    id: str
    issuer: str
    jwks: Mapping  # a JWK Set as a dict: {"keys": [...]}
    username_prefix: str = ""


def _invalid_client() -> OAuthError:
    return OAuthError("invalid_client", "Invalid client credentials.", 401)


def parse_basic_auth(header: str | None) -> tuple[str, str] | None:
    """HTTP Basic credentials, URL-unescaped as Dex does (RFC 6749 §2.3.1), or None when absent."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    if ":" not in decoded:
        return None
    user, _, password = decoded.partition(":")
    return urllib.parse.unquote_plus(user), urllib.parse.unquote_plus(password)


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
    if not client_secret or not hmac.compare_digest(client.secret.encode(), client_secret.encode()):
        raise _invalid_client()
    return client


def verify_subject_token(connector: Connector, token: str, now: float) -> dict:
    """The subject token's claims if the connector's keys signed it, its issuer matches and it has not expired.

    The audience is deliberately not checked: Dex does not, and the gateway checks it before it calls.
    Raises `access_denied` (401), without saying why to the caller; the reason goes to the log.
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
    if not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp <= now:
        raise denied("token expired or carries no exp")
    nbf = claims.get("nbf")
    if isinstance(nbf, (int, float)) and not isinstance(nbf, bool) and nbf > now + _NBF_LEEWAY:
        raise denied("token not valid yet")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise denied("token has no sub")
    return claims


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


def requested_audiences(form_audiences: list[str], scopes: list[str]) -> list[str]:
    out = [a for a in form_audiences if a]
    out += [s[len(CROSS_CLIENT_SCOPE):] for s in scopes if s.startswith(CROSS_CLIENT_SCOPE) and len(s) > len(CROSS_CLIENT_SCOPE)]
    return list(dict.fromkeys(out))


def check_cross_client_trust(clients: Mapping[str, Client], client: Client, audiences: list[str]) -> None:
    """Each audience other than the client itself must list the client as a trusted peer."""
    for aud in audiences:
        if aud == client.id:
            continue
        peer = clients.get(aud)
        if peer is None or client.id not in peer.trusted_peers:
            raise OAuthError("invalid_client", f"Client {aud!r} does not trust client {client.id!r}", 400)


@dataclass(frozen=True)
class ExchangeRequest:
    """The token-exchange form fields Dex reads."""

    subject_token: str
    subject_token_type: str
    requested_token_type: str
    connector_id: str
    scopes: list[str] = field(default_factory=list)
    audiences: list[str] = field(default_factory=list)

    @classmethod
    def from_form(cls, form: Mapping[str, str], audiences: list[str]) -> "ExchangeRequest":
        return cls(
            subject_token=form.get("subject_token", ""),
            subject_token_type=form.get("subject_token_type", ""),
            requested_token_type=form.get("requested_token_type", "") or TOKEN_TYPE_ACCESS,
            connector_id=form.get("connector_id", ""),
            scopes=form.get("scope", "").split(),
            audiences=audiences,
        )


def exchange(
    clients: Mapping[str, Client], connectors: Mapping[str, Connector], client: Client, req: ExchangeRequest,
    issuer: str, now: float,
) -> dict:
    """The claims of the token to issue for an authenticated client's exchange request, in Dex's order of checks."""
    if req.subject_token_type not in (TOKEN_TYPE_ID, TOKEN_TYPE_ACCESS):
        raise OAuthError("request_not_supported", "Invalid subject_token_type.")
    if not req.subject_token:
        raise OAuthError("invalid_request", "Missing subject_token")
    connector = connectors.get(req.connector_id)
    if connector is None:
        raise OAuthError("invalid_request", "Requested connector does not exist.")
    subject = verify_subject_token(connector, req.subject_token, now)
    if req.requested_token_type not in (TOKEN_TYPE_ID, TOKEN_TYPE_ACCESS):
        raise OAuthError("request_not_supported", "Invalid requested_token_type.")
    audiences = requested_audiences(req.audiences, req.scopes)
    check_cross_client_trust(clients, client, audiences)

    iat = int(now)
    exp = min(iat + MAX_TOKEN_LIFETIME, int(subject["exp"]))
    username = connector.username_prefix + subject["sub"]
    claims = {
        "iss": issuer,
        "sub": opaque_subject(subject["sub"], connector.id),
        # Dex writes a single audience as a string.
        "aud": (audiences[0] if len(audiences) == 1 else audiences) if audiences else client.id,
        "exp": exp,
        "iat": iat,
        "email": username,
        "email_verified": True,
        "groups": [],
        "name": username,
        "preferred_username": username,
        "federated_claims": {"connector_id": connector.id, "user_id": subject["sub"]},
    }
    if audiences and audiences != [client.id]:
        claims["azp"] = client.id
    return claims


class Dex:
    """Dex on 127.0.0.1 under `issuer`; clients and connectors are configured in-process (by user-authn)."""

    def __init__(self, issuer: str, ssl_context: ssl.SSLContext | None = None) -> None:
        self.issuer = issuer.rstrip("/")
        self._prefix = urllib.parse.urlsplit(self.issuer).path.rstrip("/")
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

    def set_connector(self, connector_id: str, issuer: str, jwks: Mapping, username_prefix: str = "") -> None:
        self.connectors[connector_id] = Connector(connector_id, issuer, dict(jwks), username_prefix)

    def remove_connector(self, connector_id: str) -> None:
        self.connectors.pop(connector_id, None)

    def jwks(self) -> dict:
        return {"keys": [self._key.export_public(as_dict=True)]}

    def discovery_document(self) -> dict:
        i = self.issuer
        return {
            "issuer": i,
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
        return web.json_response(e.body(), status=e.status, headers={"Cache-Control": "no-store"})

    async def _token(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return self._error(OAuthError("invalid_request", "method not allowed"))
        form = await request.post()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        grant = fields.get("grant_type", "")
        if grant not in _SUPPORTED_GRANTS:
            return self._error(OAuthError("unsupported_grant_type", ""))
        self.exchange_calls += 1
        try:
            client = authenticate_client(self.clients, parse_basic_auth(request.headers.get("Authorization")), fields)
            audiences = [a for a in form.getall("audience", []) if isinstance(a, str)]
            req = ExchangeRequest.from_form(fields, audiences)
            claims = exchange(self.clients, self.connectors, client, req, self.issuer, time.time())
        except OAuthError as e:
            log.info("token exchange refused: %s", e)
            return self._error(e)
        self.tokens_issued += 1
        log.info("token exchange for %s via connector %s", claims["email"], req.connector_id)
        return web.json_response(
            {
                "access_token": self.sign(claims),
                "issued_token_type": req.requested_token_type,
                "token_type": "bearer",
                "expires_in": max(0, claims["exp"] - int(time.time())),
            },
            headers={"Cache-Control": "no-store"},
        )

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
