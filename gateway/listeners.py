"""What the aiohttp listeners answer: the egress (each request admitted by `admission`, the chain the entrance
calls too, and forwarded by `proxy`) and the join listener (handed to the control loop as a typed call,
`protocol`); every refusal is a Kubernetes Status."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, Coroutine

from aiohttp import web

from contract import reasons
from contract.errors import Refusal
from contract.paths import JOIN_PATH
from gateway.accounting import ANSWERED, CLIENT_CLOSED, Outcome
from gateway.admission import ClientState, admit_egress, caught_up, closes_connection, complete, not_held
from gateway.authority import Authority
from gateway.calls import json_object
from gateway.http import JSON, status_response
from gateway.joinlimit import JoinRateLimit, client_address, token_id, trusted_networks
from gateway.protocol import ControlHandlers, JoinCall
from gateway.proxy import forward
from gateway.state import GatewayState


def _target(request: web.BaseRequest) -> bytes:
    # aiohttp decodes the target as UTF-8 with surrogate escapes: this gives back the bytes that came.
    return request.raw_path.encode("utf-8", "surrogateescape")


def _body_framing(request: web.BaseRequest) -> tuple[int | None, bool]:
    length = request.content_length
    return length, request.body_exists and length is None


class Egress:
    """A local consumer's request to a peer's API: reviewed here, then sent over mTLS to the peer's entrance."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        return await _served(self.state, "egress", request, lambda client, outcome: self._serve(
            request, client, outcome))

    async def _serve(self, request: web.BaseRequest, client: ClientState, outcome: Outcome) -> web.StreamResponse:
        state = self.state
        length, chunked = _body_framing(request)
        args = (state, client, request.method.encode(), _target(request), request.raw_headers, length, chunked)
        decision = await caught_up(state, admit_egress(*args), admit_egress, *args)
        admitted = await complete(state, client, decision)
        pool = state.peer_pool(decision.peer)
        authority = Authority(decision.peer.name, frozenset(client.capabilities.split(",")), decision.account,
                              decision.expires)
        return await _held(state, request, authority, outcome,
                           forward(state, request, "egress", client.peer, pool, admitted, outcome))


async def _served(state: GatewayState, listener: str, request: web.BaseRequest,
                  serve: Callable[[ClientState, Outcome], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Serve one request of the entrance or the egress and account for what it came to (accounting.OUTCOMES):
    a refusal is answered as a Status, a client that goes away (cancelling the handler, or found gone on a write)
    ends it as client_closed with the code its answer had begun with."""
    start = time.perf_counter()
    client = ClientState()
    outcome = Outcome()
    in_flight = state.accounting.in_flight[listener]
    in_flight.inc()
    try:
        resp = await serve(client, outcome)
        if not outcome.code:
            outcome.began(resp.status)
        outcome.ended(ANSWERED)
        return resp
    except Refusal as refusal:
        outcome.refused(refusal)
        return status_response(refusal.code, refusal.reason, refusal.message, close=closes_connection(refusal),
                               retry_after=refusal.retry_after)
    except (asyncio.CancelledError, ConnectionError):
        outcome.ended(CLIENT_CLOSED)
        raise
    except Exception:
        outcome.failed()  # http.py answers 500 InternalError and logs the traceback
        raise
    finally:
        in_flight.dec()
        state.accounting.record(listener, client.peer, client.capabilities, request.method, request.path, outcome,
                                start)


async def _held(state: GatewayState, request: web.BaseRequest, authority: Authority | None, outcome: Outcome,
                forwarding: Coroutine[Any, Any, web.StreamResponse], namespace: str | None = None
                ) -> web.StreamResponse:
    """Forward while `state.streams` holds the request with what admitted it: when a registry or the token's
    expiry withdraws that, the client's connection is aborted (the handler is cancelled with it) and the request
    ends as withdrawn."""
    key = object()
    transport = request.transport

    def withdraw() -> None:
        outcome.withdraw()
        transport.abort()  # type: ignore[union-attr]

    if authority is None or transport is None or not state.streams.add(key, authority, withdraw, state.registry,
                                                                         namespace):
        forwarding.close()
        raise not_held(authority)
    try:
        return await forwarding
    finally:
        state.streams.discard(key)


class Join:
    """POST /v1/join, handed to the control loop; refused joins count against the client's address and the
    attempt's token ID (joinlimit), the address as the trusted Ingress reports it."""

    def __init__(self, state: GatewayState, handlers: ControlHandlers) -> None:
        self.state = state
        self.handlers = handlers
        self.limit = JoinRateLimit(state.limits.join_failures_per_minute)
        self.trusted = trusted_networks(state.config.trusted_proxies)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        code = 500
        remote = client_address(request.remote, request.headers.get("X-Forwarded-For"),
                                request.headers.get("X-Real-IP"), self.trusted)
        try:
            if request.path != JOIN_PATH:
                raise Refusal(404, reasons.NOT_FOUND, f"the join listener serves POST {JOIN_PATH} only")
            if request.method != "POST":
                raise Refusal(405, reasons.METHOD_NOT_ALLOWED, f"{JOIN_PATH} takes POST")
            if not self.limit.allows(remote):
                raise Refusal(429, reasons.TOO_MANY_ATTEMPTS, "too many refused join attempts from this address in "
                              "a minute; wait a minute and check the connection string")
            body = await read_json(request, self.state.limits.max_join_bytes)
            tid = token_id(body)
            # Over the token ID's limit the control loop still lets a token that verifies through (JoinCall).
            limited = not self.limit.allows(remote, tid)
            try:
                answer = await self.handlers.join(JoinCall(body=body, remote=remote, token_limited=limited))
            except Refusal as err:
                if 400 <= err.code < 500:
                    self.limit.refused(remote, tid)
                raise
            code = 200
            return web.Response(body=json.dumps(answer).encode(), content_type=JSON)
        except Refusal as refusal:
            code = refusal.code
            return status_response(refusal.code, refusal.reason, refusal.message)
        finally:
            self.state.accounting.finish("join", "-", "-", request.method, request.path, code, start)


async def read_json(request: web.BaseRequest, limit: int) -> dict:
    """The request's body as a JSON object of at most `limit` bytes, or the Refusal saying what is wrong."""
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the body is larger than {limit} bytes")
    chunks, seen = [], 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        seen += len(chunk)
        if seen > limit:
            raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return json_object(b"".join(chunks))
