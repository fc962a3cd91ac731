"""TokenReview of a local consumer's token at the egress (DESIGN.md 7): the request, what its answer grants, and
the client that asks the API server.

The review asks for the audiences of the peering's effective capabilities; the answer's audiences name the
capabilities the token was made for, and `gateway.consumers` says which of them the ServiceAccount may use.
An authenticator that is not audience-aware answers no audiences: that is no grant, not every one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

import aiohttp
from yarl import URL

from contract import reasons
from contract.errors import Refusal
from contract.names import audience
from gateway.consumers import consumer_capabilities, service_account
from gateway.registry import Peer, Registry

REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
_JSON = "application/json"


def review_audiences(peer: Peer) -> dict[str, str]:
    """The audiences to review a token for (the peer cluster's, as the consumer asked for its token), each with
    the capability it stands for."""
    return {audience(peer.uuid, c): c for c in sorted(peer.effective)}


def review_body(token: str, audiences: dict[str, str]) -> bytes:
    return json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                       "spec": {"token": token, "audiences": list(audiences)}}).encode()


def reviewed_capabilities(status: int, body: object, peer: Peer, registry: Registry,
                          audiences: dict[str, str]) -> frozenset[str]:
    """The capabilities of `peer` that a TokenReview answer (`status`, parsed `body`) grants, or a Refusal saying
    what is wrong with the token or with the gateway's access to TokenReview."""
    if status not in (200, 201) or not isinstance(body, dict):
        raise Refusal(503, reasons.TOKEN_REVIEW_UNAVAILABLE, f"the API server answered {status} to the TokenReview; "
                      "check the gateway's RBAC for tokenreviews")
    result = body.get("status")
    result = result if isinstance(result, dict) else {}
    if result.get("authenticated") is not True:  # a boolean in a TokenReview: "false" or 1 is no yes
        raise Refusal(401, reasons.TOKEN_INVALID, "the token is not valid for this peering; request a projected "
                      "ServiceAccount token with one of the audiences in status.access.audiences")
    user = result.get("user")
    username = user.get("username") if isinstance(user, dict) else None
    answered = result.get("audiences")
    granted = [audiences[a] for a in answered if isinstance(a, str) and a in audiences] \
        if isinstance(answered, list) else []
    if not granted:
        raise Refusal(401, reasons.TOKEN_AUDIENCE_MISMATCH, "the token's audience names no capability effective for "
                      f"peering {peer.name}; use an audience listed in its status.access.audiences")
    allowed = consumer_capabilities(registry, granted, service_account(username))
    if not allowed:
        who = username if isinstance(username, str) and username else "the caller"
        raise Refusal(403, reasons.NOT_A_CONSUMER, f"{who} is not a consumer of a capability effective for peering "
                      f"{peer.name}; add it to spec.consumers of the PeeringCapability")
    return allowed


class TokenReviewer:
    """Posts TokenReviews for the egress's review cache: called with (peer name / registry generation, token), it
    answers the granted capabilities joined by commas and how long the answer may be reused."""

    def __init__(self, session: aiohttp.ClientSession, api_server: str, api_token: Callable[[], str], *,
                 timeout: float, ttl: float, registry: Callable[[], Registry],
                 on_unavailable: Callable[[], None] | None = None) -> None:
        self._session = session
        self._url = URL(api_server.rstrip("/") + REVIEW_PATH, encoded=True)
        self._api_token = api_token
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._ttl = ttl
        self._registry = registry
        self._on_unavailable = on_unavailable

    async def __call__(self, key: str, token: str) -> tuple[str, float]:
        registry = self._registry()
        peer = registry.peers.get(key.rsplit("/", 1)[0])
        if peer is None:
            raise Refusal(404, reasons.PEER_NOT_FOUND, "the peering was removed while the request was checked")
        audiences = review_audiences(peer)
        try:
            async with self._session.post(
                    self._url, data=review_body(token, audiences),
                    headers={"Authorization": "Bearer " + self._api_token(), "Content-Type": _JSON, "Accept": _JSON},
                    timeout=self._timeout) as resp:
                body = await resp.json(content_type=None) if resp.status in (200, 201) else None
                status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, RecursionError) as exc:
            if self._on_unavailable is not None:
                self._on_unavailable()
            raise Refusal(503, reasons.TOKEN_REVIEW_UNAVAILABLE, f"the API server cannot review the token now "
                          f"({type(exc).__name__}); retry") from None
        allowed = reviewed_capabilities(status, body, peer, registry, audiences)
        return ",".join(sorted(allowed)), self._ttl
