"""OIDC bearer tokens, as kube-apiserver's structured AuthenticationConfiguration (a `jwt` authenticator) accepts
the ID tokens of Dex.

Deckhouse's control-plane-manager renders one `jwt` entry for Dex (`_authentication_configuration.tpl`):
issuer Dex's, `audiences: [kubernetes]` (any of them matches), username from claim `email` with prefix "",
groups from claim `groups` with prefix "", extras from CEL expressions over `claims` (`claims.name` without a
guard, so a token without `name` fails), and `userValidationRules` that refuse a username or any group starting
with `system:`. `deckhouse_dex_authenticator` builds exactly that; `OIDCAuthenticator` takes each part as a
setting. As kube-apiserver does with the username claim `email`, an `email_verified` claim that is present must
be true ("oidc: email not verified"). Any refusal makes the request 401.

The signing keys come from the issuer's discovery document over HTTPS, verified with a CA bundle, are cached,
and are fetched again when a token names a key that is not in the cache (the issuer rotated), at most once per
`refetch_interval` so that tokens with made-up key IDs cannot make the API server hammer the issuer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from datetime import datetime, timedelta, timezone
from typing import Awaitable, Callable, Sequence

import aiohttp
import celpy
from aiohttp.abc import AbstractResolver
from jwcrypto import jwk, jws
from jwcrypto.common import JWException

from lab.apiserver.auth.tokens import TokenInvalid, audiences_of, is_compact_jws, unverified_claims
from lab.apiserver.auth.types import UserInfo

log = logging.getLogger(__name__)

JWKSFetcher = Callable[[], Awaitable[dict]]

# go-oidc's allowance for a clock ahead of the issuer's on `nbf`; `exp` gets none, as in kube-apiserver.
NBF_SKEW = timedelta(minutes=5)
# Bound on a discovery document or key set: these come from the network.
_MAX_DOCUMENT = 1 << 20

# Deckhouse's claim mappings and rules for Dex (control-plane-manager's AuthenticationConfiguration).
DECKHOUSE_AUDIENCES = ("kubernetes",)
DECKHOUSE_EXTRA = (
    ("user-authn.deckhouse.io/name", "claims.name"),
    ("user-authn.deckhouse.io/preferred_username",
     "has(claims.preferred_username) ? claims.preferred_username : null"),
    ("user-authn.deckhouse.io/dex-provider",
     "has(claims.federated_claims) && has(claims.federated_claims.connector_id) ? "
     "claims.federated_claims.connector_id : null"),
)
DECKHOUSE_USER_VALIDATION_RULES = (
    ("!user.username.startsWith('system:')", "username cannot used reserved system: prefix"),
    ("user.groups.all(group, !group.startsWith('system:'))", "groups cannot used reserved system: prefix"),
)

_CEL = celpy.Environment()


class JWKSFetchError(Exception):
    """The issuer's keys could not be fetched; the message says which step failed and what to check."""


def discovery_jwks_fetcher(issuer_url: str, ca_pem: bytes | None = None, *,
                           resolver: AbstractResolver | None = None, timeout: float = 10.0) -> JWKSFetcher:
    """A fetcher that reads `<issuer>/.well-known/openid-configuration`, then the key set at its `jwks_uri`.

    ca_pem is the bundle the issuer's certificate must chain to (the system's trust store when None); resolver
    maps the issuer's host name (the lab resolves its host names to loopback). Each fetch uses its own short-lived
    session: fetches are rare, and nothing is left open between them.
    """
    discovery_url = issuer_url.rstrip("/") + "/.well-known/openid-configuration"

    async def fetch() -> dict:
        context = ssl.create_default_context(cadata=ca_pem.decode("ascii") if ca_pem else None)
        connector = aiohttp.TCPConnector(ssl=context, resolver=resolver)
        try:
            async with aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as session:
                doc = await _get_json(session, discovery_url, "discovery document")
                if doc.get("issuer") != issuer_url:
                    raise JWKSFetchError(f"the discovery document at {discovery_url} names issuer "
                                         f"{doc.get('issuer')!r}, not {issuer_url!r}; the issuer URL must match "
                                         "exactly, including the trailing slash")
                jwks_uri = doc.get("jwks_uri")
                if not isinstance(jwks_uri, str) or not jwks_uri.startswith("https://"):
                    raise JWKSFetchError(f"the discovery document at {discovery_url} has no https jwks_uri")
                return await _get_json(session, jwks_uri, "key set")
        except (aiohttp.ClientError, asyncio.TimeoutError, ssl.SSLError, OSError) as exc:
            raise JWKSFetchError(f"could not fetch the keys of {issuer_url}: {exc.__class__.__name__}: {exc}; "
                                 "check that the issuer is up and its certificate chains to the CA bundle") from exc

    return fetch


async def _get_json(session: aiohttp.ClientSession, url: str, what: str) -> dict:
    async with session.get(url, headers={"Accept": "application/json"}) as resp:
        if resp.status != 200:
            raise JWKSFetchError(f"{what} at {url} answered HTTP {resp.status}")
        body = await resp.content.read(_MAX_DOCUMENT + 1)
        if len(body) > _MAX_DOCUMENT:
            raise JWKSFetchError(f"{what} at {url} is larger than {_MAX_DOCUMENT} bytes")
    try:
        data = json.loads(body)
    except ValueError:
        raise JWKSFetchError(f"{what} at {url} is not JSON") from None
    if not isinstance(data, dict):
        raise JWKSFetchError(f"{what} at {url} is not a JSON object")
    return data


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _compile(expression: str, what: str):
    try:
        return _CEL.program(_CEL.compile(expression))
    except Exception as exc:  # celpy raises its own parse error types
        raise ValueError(f"{what} {expression!r} is not a valid CEL expression: {exc}") from None


def _cel_to_python(value):
    """A CEL result as plain Python: strings, lists, None (null) and the rest as they are."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_cel_to_python(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


class OIDCAuthenticator:
    """Authenticates ID tokens of one OIDC issuer the way one `jwt` entry of kube-apiserver's structured
    AuthenticationConfiguration does.

    audiences: the token's `aud` must contain one of them (audienceMatchPolicy MatchAny). extra: (key, CEL
    valueExpression over `claims`) pairs; an expression that fails refuses the token, one that gives null adds
    nothing. user_validation_rules: (CEL expression over `user`, message) pairs that must all be true.
    jwks_fetcher returns the issuer's JWK Set; when None, it is read over HTTPS through the issuer's discovery
    document, trusting ca_pem and resolving names with resolver.
    """

    def __init__(self, issuer_url: str, audiences: Sequence[str], username_claim: str = "email",
                 groups_claim: str = "groups", username_prefix: str = "", groups_prefix: str = "",
                 jwks_fetcher: JWKSFetcher | None = None, *, extra: Sequence[tuple[str, str]] = (),
                 user_validation_rules: Sequence[tuple[str, str]] = (),
                 ca_pem: bytes | None = None, resolver: AbstractResolver | None = None,
                 signing_algs: tuple[str, ...] = ("RS256",), refetch_interval: float = 5.0,
                 clock: Callable[[], datetime] = _utcnow, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not issuer_url.startswith("https://"):
            raise ValueError(f"the OIDC issuer URL must use https, got {issuer_url!r}")
        if isinstance(audiences, str):
            audiences = (audiences,)
        if not audiences or not all(isinstance(a, str) and a for a in audiences):
            raise ValueError("give the OIDC authenticator one or more non-empty audiences (the client ID, e.g. "
                             "kubernetes)")
        if not username_claim:
            raise ValueError("the username claim must not be empty (Deckhouse uses email)")
        self.issuer_url = issuer_url
        self.audiences = tuple(audiences)
        self.username_claim = username_claim
        self.groups_claim = groups_claim
        self.username_prefix = username_prefix
        self.groups_prefix = groups_prefix
        self._extra = [(key, expr, _compile(expr, f"extra mapping {key!r}")) for key, expr in extra]
        self._rules = [(expr, message, _compile(expr, "user validation rule"))
                       for expr, message in user_validation_rules]
        self.signing_algs = tuple(signing_algs)
        self._fetch = jwks_fetcher or discovery_jwks_fetcher(issuer_url, ca_pem, resolver=resolver)
        self._refetch_interval = refetch_interval
        self._clock = clock
        self._monotonic = monotonic
        self._keys: jwk.JWKSet | None = None
        self._last_attempt: float | None = None
        self._generation = 0
        self._lock = asyncio.Lock()
        self.fetch_count = 0

    def handles(self, token: str) -> bool:
        """Whether the token claims to come from this issuer (unverified: only to pick the authenticator)."""
        claims = unverified_claims(token)
        return claims is not None and claims.get("iss") == self.issuer_url

    async def authenticate_token(self, token: str) -> UserInfo | None:
        """The user of a valid ID token of this issuer for this client; None for any other token."""
        if not self.handles(token):
            return None
        try:
            return await self.verify(token)
        except TokenInvalid as exc:
            log.debug("OIDC token of %s refused: %s", self.issuer_url, exc.reason)
            return None

    async def verify(self, token: str) -> UserInfo:
        """The user of a valid ID token; TokenInvalid with the reason otherwise (never with the token in it)."""
        if not is_compact_jws(token):
            raise TokenInvalid("token is not a compact JWS")
        parsed = jws.JWS()
        try:
            parsed.deserialize(token)
            header = parsed.jose_header
        except (JWException, ValueError, TypeError):
            raise TokenInvalid("token is not a compact JWS") from None
        alg = header.get("alg") if isinstance(header, dict) else None
        if alg not in self.signing_algs:
            raise TokenInvalid(f"signing algorithm must be one of {', '.join(self.signing_algs)}")
        kid = header.get("kid")
        keys = await self._candidate_keys(kid)
        if not keys:
            raise TokenInvalid("token is signed by a key the issuer does not publish")
        parsed.allowed_algs = [alg]
        for key in keys:
            try:
                parsed.verify(key)
                break
            except (JWException, ValueError, TypeError):
                continue
        else:
            raise TokenInvalid("token signature is invalid")
        try:
            claims = json.loads(parsed.payload)
        except ValueError:
            raise TokenInvalid("token payload is not JSON") from None
        if not isinstance(claims, dict):
            raise TokenInvalid("token payload is not a JSON object")
        return self._user(claims)

    def _user(self, claims: dict) -> UserInfo:
        if claims.get("iss") != self.issuer_url:
            raise TokenInvalid("token issuer does not match")
        token_auds = audiences_of(claims)
        if not any(a in token_auds for a in self.audiences):
            raise TokenInvalid(f"oidc: expected audience in {list(self.audiences)}, got {token_auds}")
        now = self._clock()
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if not isinstance(exp, (int, float)):
            raise TokenInvalid("token has no expiry")
        if now > datetime.fromtimestamp(exp, timezone.utc):
            raise TokenInvalid("token has expired")
        if isinstance(nbf, (int, float)) and now + NBF_SKEW < datetime.fromtimestamp(nbf, timezone.utc):
            raise TokenInvalid("token is not valid yet")
        username = claims.get(self.username_claim)
        if not isinstance(username, str) or not username:
            raise TokenInvalid(f"oidc: parse username claims {self.username_claim!r}: claim not present or not "
                               "a non-empty string")
        if self.username_claim == "email" and "email_verified" in claims:
            verified = claims["email_verified"]
            if not isinstance(verified, bool):
                raise TokenInvalid("oidc: parse 'email_verified' claim: must be a boolean")
            if not verified:
                raise TokenInvalid("oidc: email not verified")
        raw_groups = claims.get(self.groups_claim) if self.groups_claim else None
        if raw_groups is None:
            groups: list[str] = []
        elif isinstance(raw_groups, str):
            groups = [raw_groups]
        elif isinstance(raw_groups, list) and all(isinstance(g, str) for g in raw_groups):
            groups = list(raw_groups)
        else:
            raise TokenInvalid(f"claim {self.groups_claim!r} must be a string or an array of strings")
        user = UserInfo(username=self.username_prefix + username,
                        groups=tuple(self.groups_prefix + g for g in groups),
                        extra=self._extras(claims))
        self._validate_user(user)
        return user

    def _extras(self, claims: dict) -> dict[str, tuple[str, ...]]:
        if not self._extra:
            return {}
        activation = {"claims": celpy.json_to_cel(claims)}
        out: dict[str, tuple[str, ...]] = {}
        for key, expr, program in self._extra:
            try:
                value = _cel_to_python(program.evaluate(activation))
            except Exception as exc:  # celpy raises CELEvalError for a missing claim, among others
                raise TokenInvalid(f"oidc: error evaluating extra claim expression {expr!r}: "
                                   f"{_cel_error(exc)}") from None
            if value is None:
                continue
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise TokenInvalid(f"oidc: extra claim expression {expr!r} must give a string or a list of "
                                   "strings")
            if values:
                out[key] = tuple(values)
        return out

    def _validate_user(self, user: UserInfo) -> None:
        if not self._rules:
            return
        activation = {"user": celpy.json_to_cel({"username": user.username, "uid": user.uid,
                                                 "groups": list(user.groups),
                                                 "extra": {k: list(v) for k, v in user.extra.items()}})}
        for expr, message, program in self._rules:
            try:
                ok = program.evaluate(activation)
            except Exception as exc:
                raise TokenInvalid(f"oidc: error evaluating user info validation rule {expr!r}: "
                                   f"{_cel_error(exc)}") from None
            if not isinstance(ok, (bool, celpy.celtypes.BoolType)):
                raise TokenInvalid(f"oidc: user info validation rule {expr!r} did not give a boolean")
            if not bool(ok):
                raise TokenInvalid(f"oidc: error evaluating user info validation rule: {message}")

    async def _candidate_keys(self, kid: str | None) -> list[jwk.JWK]:
        keys = self._matching(kid)
        if keys:
            return keys
        await self._refresh()
        return self._matching(kid)

    def _matching(self, kid: str | None) -> list[jwk.JWK]:
        if self._keys is None:
            return []
        if kid is not None:
            key = self._keys.get_key(kid)
            return [key] if key is not None else []
        # A token without kid: any published key may have signed it, as go-oidc tries them all.
        return list(self._keys["keys"])

    async def _refresh(self) -> None:
        """Fetch the key set once for all callers waiting now, and not again before refetch_interval has passed."""
        seen = self._generation
        async with self._lock:
            if self._generation != seen:
                return  # someone fetched while this caller waited for the lock
            now = self._monotonic()
            if self._last_attempt is not None and now - self._last_attempt < self._refetch_interval:
                return
            self._last_attempt = now
            self.fetch_count += 1
            try:
                raw = await self._fetch()
                keys = jwk.JWKSet.from_json(json.dumps(raw))
            except Exception as exc:  # noqa: BLE001 - a failing issuer must refuse its tokens, not fail the request
                log.warning("could not refresh the keys of OIDC issuer %s: %s", self.issuer_url, exc)
                return
            finally:
                self._generation += 1
            self._keys = keys


def _cel_error(exc: Exception) -> str:
    args = getattr(exc, "args", ())
    return str(args[0]) if args else type(exc).__name__


def deckhouse_dex_authenticator(issuer_url: str, **kwargs) -> OIDCAuthenticator:
    """kube-apiserver's authenticator of Dex tokens as Deckhouse configures it (see the module docstring)."""
    return OIDCAuthenticator(issuer_url, DECKHOUSE_AUDIENCES, username_claim="email", username_prefix="",
                             groups_claim="groups", groups_prefix="", extra=DECKHOUSE_EXTRA,
                             user_validation_rules=DECKHOUSE_USER_VALIDATION_RULES, **kwargs)
