"""RFC 8693 token exchange at Dex (DESIGN.md 7, step 3): cached by token hash, one call per token at a time.

The request is what upstream Dex (which Deckhouse builds unpatched for token exchange) and Deckhouse's own
documentation of token exchange want: HTTP Basic client auth, `connector_id`, an id_token in and out, and the
scopes that make Dex put what kube-apiserver needs into the token: `email` (the username, with `email_verified`),
`profile` (`name`, from which Deckhouse's AuthenticationConfiguration derives extras: a token without it is
refused), `groups`, and `audience:server:client_id:kubernetes` (aud `kubernetes`; Dex ignores a form `audience`).
Dex's answers are mapped to reasons an administrator can act on (`dex_refusal`); docs/user-authn-contract.md has
the whole contract.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from urllib.parse import quote
from typing import Awaitable, Callable

import aiohttp
from cachetools import TLRUCache

from contract import reasons
from contract.errors import Refusal
from gateway.ratelimit import TokenBuckets, retry_after_seconds
from gateway.tokens import numeric_date

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"


#: Dex's cross-client scope: the issued token's `aud` names that client, if it trusts ours (else 500).
CROSS_CLIENT_SCOPE = "audience:server:client_id:"


def exchange_scope(audience: str) -> str:
    return f"openid email profile groups {CROSS_CLIENT_SCOPE}{audience}"


def exchange_form(connector_id: str, subject_token: str, audience: str) -> dict[str, str]:
    """The form Dex expects for exchanging a peer's ServiceAccount token into an id_token for `audience` (the
    OIDC client kube-apiserver accepts, `kubernetes` in Deckhouse)."""
    return {"grant_type": GRANT, "connector_id": connector_id, "subject_token": subject_token,
            "subject_token_type": ID_TOKEN, "requested_token_type": ID_TOKEN, "scope": exchange_scope(audience)}


#: Reasons of a failed exchange, as the consumer's Status and the ClusterPeer's TokenExchangeReady say them.
EXCHANGE_REFUSED = reasons.TOKEN_EXCHANGE_REFUSED
EXCHANGE_MISCONFIGURED = reasons.TOKEN_EXCHANGE_MISCONFIGURED
EXCHANGE_UNAVAILABLE = reasons.TOKEN_EXCHANGE_UNAVAILABLE


def dex_refusal(status: int, body: object, *, client_id: str, connector_id: str, audience: str) -> Refusal:
    """What a non-200 answer of Dex's token endpoint means, as a Refusal with a message naming what to fix.

    Upstream Dex answers 400 invalid_request for a missing or unknown connector, 401 invalid_client for a client
    it does not know or a wrong secret, 401 access_denied for a subject token that does not verify, and 500
    server_error when the token cannot be signed, which is what it does when the `audience:server:client_id:`
    scope names a client that does not list ours in trustedPeers."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, str) else ""
    described = body.get("error_description") if isinstance(body, dict) else None
    # Only a string is quoted (RFC 6749 5.2): the text of a deep array would need more recursion than parsing it.
    described = described if isinstance(described, str) else ""
    detail = f"{status} {error[:64]}".strip() + (f": {described[:200]}" if described else "")
    if error == "invalid_client":
        return Refusal(503, EXCHANGE_MISCONFIGURED,
                       f"Dex does not accept the module's client {client_id} ({detail}); check the DexClient "
                       f"of the module and the Secret user-authn writes for it (key clientSecret)")
    if error == "invalid_request" and "connector" in described.lower():
        return Refusal(503, EXCHANGE_MISCONFIGURED,
                       f"Dex has no connector {connector_id} ({detail}): user-authn has not applied the peer's "
                       "TokenExchangeProvider; see the TokenExchangeReady condition of the ClusterPeer")
    if status >= 500 and error == "server_error":
        return Refusal(503, EXCHANGE_MISCONFIGURED,
                       f"Dex failed the exchange ({detail}); Dex answers so when it has no client {audience!r} "
                       "(user-authn renders it only with publishAPI.enabled: true in ModuleConfig user-authn, a "
                       "kubeconfigGenerator entry or a DexAuthenticator with allowAccessToKubernetes) or when that "
                       f"client does not list {client_id} in trustedPeers (the module's DexClient needs the "
                       "annotation dexclient.deckhouse.io/allow-access-to-kubernetes: \"true\"); `d8 k peering "
                       "check` tells which")
    if status >= 500:
        return Refusal(503, EXCHANGE_UNAVAILABLE,
                       f"Dex answered {detail} to the token exchange; it is retried on the next request")
    if error == "access_denied":
        return Refusal(401, EXCHANGE_REFUSED,
                       f"Dex refused the peer's token ({detail}): it does not verify against the issuer and keys "
                       "the peer published; the peer's next offer may bring new keys")
    return Refusal(401, EXCHANGE_REFUSED,
                   f"Dex refused to exchange the token ({detail}); check the TokenExchangeReady condition of the "
                   "ClusterPeer")


#: An access token as RFC 6750 2.1 spells one (b64token), so that it is one header value upstream and nothing else.
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
#: Seconds an exchanged token is used for when Dex's answer names no lifetime (RFC 6749 5.1: expires_in is optional).
DEFAULT_EXPIRES_IN = 300.0


def exchange_answer(status: int, body: object, *, client_id: str, connector_id: str, audience: str
                    ) -> tuple[str, float]:
    """The exchanged token and its lifetime in seconds from an answer of Dex's token endpoint (`status`, parsed
    `body`, None when it was no JSON), or the Refusal it means: `dex_refusal` for a status other than 200, 503
    TokenExchangeUnavailable for a 200 without an access token that can be sent as one header value."""
    if status != 200:
        raise dex_refusal(status, body, client_id=client_id, connector_id=connector_id, audience=audience)
    token = body.get("access_token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not _B64TOKEN.fullmatch(token):
        raise Refusal(503, EXCHANGE_UNAVAILABLE, "Dex answered the token exchange without an access_token (a "
                      "token of RFC 6750 characters); it is retried on the next request")
    expires_in = numeric_date(body.get("expires_in"))  # type: ignore[union-attr]
    return token, DEFAULT_EXPIRES_IN if expires_in is None else expires_in


def basic_auth(client_id: str, secret: str) -> str:
    pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}".encode()
    return "Basic " + base64.b64encode(pair).decode()


class PeerRate(TokenBuckets):
    """A token bucket per Dex connector (one per peer, `ratelimit.TokenBuckets`): `rate` exchanges a second, bursts
    of `burst`; a call beyond it is refused with 429 TokenExchangeRateLimited and a Retry-After. Only calls that
    reach Dex take a token: a cached or shared exchange costs none."""

    def __init__(self, rate: float, burst: float, *, max_peers: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(rate, burst, max_keys=max_peers, clock=clock, unit="exchange")

    def refusal(self, connector_id: str, wait: float) -> Refusal:
        seconds = retry_after_seconds(wait)
        return Refusal(429, reasons.TOKEN_EXCHANGE_RATE_LIMITED,
                       f"this peer's consumers present more new tokens than this gateway exchanges at Dex for one "
                       f"peer ({self.rate:g} a second, bursts of {self.burst:g}); retry after {seconds} s, and "
                       "reuse a token until the kubelet refreshes it instead of requesting a new one per request",
                       retry_after=seconds)


class ExchangeCache:
    """Exchanged tokens by (connector, sha256 of the subject token); concurrent misses share one Dex call.

    `call` does the HTTP exchange and returns (token, expires_in seconds). Failures are not cached: the next
    request tries again, so Dex coming back needs no restart. The cache is a cachetools TLRUCache: an entry is
    gone at its own end (`expires_in` less `margin`, never past the subject token's expiry), and a full cache
    drops the expired entries, then the least recently used one, never everyone at once. `rate` bounds the calls
    that reach Dex per connector (PeerRate).
    """

    def __init__(self, call: Callable[[str, str], Awaitable[tuple[str, float]]], *, margin: float,
                 max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic,
                 rate: PeerRate | None = None) -> None:
        self._call = call
        self._margin = margin
        self._clock = clock
        self._rate = rate
        self._done: TLRUCache = TLRUCache(max_entries, ttu=_until, timer=clock)
        self._pending: dict[tuple[str, bytes], asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self.calls = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._done)

    def cached(self, connector_id: str, token_hash: bytes) -> str | None:
        entry = self._done.get((connector_id, token_hash))
        if entry is not None:
            self.hits += 1
            return entry[0]
        return None

    def lifetime(self, connector_id: str, token_hash: bytes) -> float:
        """Seconds the cached exchange of this token stays usable (0 when none is cached)."""
        entry = self._done.get((connector_id, token_hash))
        return max(0.0, entry[1] - self._clock()) if entry is not None else 0.0

    async def get(self, connector_id: str, token_hash: bytes, token: str, *, not_after: float) -> str:
        """The exchanged token; `not_after` (monotonic) caps the cache at the subject token's own expiry."""
        hit = self.cached(connector_id, token_hash)
        if hit is not None:
            return hit
        key = (connector_id, token_hash)
        fut = self._pending.get(key)
        if fut is None:
            if self._rate is not None:
                wait = self._rate.take(connector_id)
                if wait:
                    raise self._rate.refusal(connector_id, wait)
            fut = asyncio.get_running_loop().create_future()
            self._pending[key] = fut
            # The Dex call runs in its own task so that one waiter going away does not cancel it for the others.
            task = asyncio.get_running_loop().create_task(self._fill(key, token, not_after, fut))
            self._tasks.add(task)
            task.add_done_callback(self._finished)
        else:
            self.hits += 1
        return await asyncio.shield(fut)

    async def _fill(self, key: tuple[str, bytes], token: str, not_after: float, fut: asyncio.Future) -> None:
        try:
            self.calls += 1
            exchanged, expires_in = await self._call(key[0], token)
            until = min(self._clock() + expires_in - self._margin, not_after)
            if until > self._clock():
                self._done[key] = (exchanged, until)
            fut.set_result(exchanged)
        except BaseException as exc:  # handed to every waiter, then re-raised only if it is a cancellation
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, Exception) else Refusal(
                    503, reasons.TOKEN_EXCHANGE_UNAVAILABLE, "the token exchange was interrupted; retry"))
                fut.exception()  # mark retrieved: waiters may all be gone
            if not isinstance(exc, Exception):
                raise
        finally:
            self._pending.pop(key, None)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _until(key: object, value: tuple[str, float], now: float) -> float:
    return value[1]


class DexClient:
    """The HTTP side of the exchange, on one pooled session to Dex. Client credentials go in HTTP Basic,
    form-urlencoded first as RFC 6749 2.3.1 asks (Dex decodes them so)."""

    def __init__(self, session: aiohttp.ClientSession, token_endpoint: str, client_id: str,
                 client_secret: Callable[[], str], audience: str, timeout: float,
                 observe: Callable[[float, str], None] | None = None,
                 on_outcome: Callable[[str, tuple[str, str] | None], None] | None = None) -> None:
        self._session = session
        self._url = token_endpoint
        self._client_id = client_id
        self._secret = client_secret
        self._audience = audience
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._observe = observe
        self._on_outcome = on_outcome

    async def __call__(self, connector_id: str, token: str) -> tuple[str, float]:
        start = time.perf_counter()
        outcome = "error"
        try:
            async with self._session.post(
                    self._url, data=exchange_form(connector_id, token, self._audience),
                    headers={"Authorization": basic_auth(self._client_id, self._secret())},
                    timeout=self._timeout) as resp:
                try:
                    body = await resp.json(content_type=None)
                except (ValueError, RecursionError):
                    body = None
                try:
                    answer = exchange_answer(resp.status, body, client_id=self._client_id,
                                             connector_id=connector_id, audience=self._audience)
                except Refusal as refusal:
                    outcome = "refused" if refusal.code < 500 else "error"
                    self._report(connector_id, refusal)
                    raise
                outcome = "ok"
                self._report(connector_id, None)
                return answer
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            refusal = Refusal(503, EXCHANGE_UNAVAILABLE,
                              f"Dex cannot be reached for the token exchange ({type(exc).__name__}); "
                              "it is retried on the next request")
            self._report(connector_id, refusal)
            raise refusal from None
        finally:
            if self._observe is not None:
                self._observe(time.perf_counter() - start, outcome)

    def _report(self, connector_id: str, refusal: Refusal | None) -> None:
        if self._on_outcome is not None:
            self._on_outcome(connector_id, None if refusal is None else (refusal.reason, refusal.message))


class ExchangeFailures:
    """The last failed token exchange per Dex connector, (reason, message), cleared by a success: the control loop
    shows it in the ClusterPeer's TokenExchangeReady. `record` says whether the entry changed, and tells every
    subscriber (`subscribe`) the connector whose entry did."""

    MAX_CONNECTORS = 10_000

    def __init__(self) -> None:
        self.by_connector: dict[str, tuple[str, str]] = {}
        self._subscribers: list[Callable[[str], None]] = []

    def subscribe(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call `fn(connector_id)` after each change of an entry; returns what unsubscribes it."""
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def record(self, connector_id: str, failure: tuple[str, str] | None) -> bool:
        if not self._changed(connector_id, failure):
            return False
        for fn in list(self._subscribers):
            fn(connector_id)
        return True

    def _changed(self, connector_id: str, failure: tuple[str, str] | None) -> bool:
        if self.by_connector.get(connector_id) == failure:
            return False
        if failure is None:
            self.by_connector.pop(connector_id, None)
            return True
        if len(self.by_connector) >= self.MAX_CONNECTORS and connector_id not in self.by_connector:
            return False  # bounded: far more connectors than peers means something else is wrong
        self.by_connector[connector_id] = failure
        return True
