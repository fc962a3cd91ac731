"""What the aiohttp path answers on the entrance, the egress and the join listener. Each request is admitted by
`admission` (the chain the raw path calls too), forwarded by `proxy`, or handed to the control loop as a typed
call (`protocol`); every refusal is a Kubernetes Status."""

from __future__ import annotations

import json
import time
from typing import Any, Coroutine

from aiohttp import web

from contract import reasons
from contract.errors import Refusal
from contract.paths import JOIN_PATH, PEER_PREFIX
from gateway.admission import (ClientState, admit_egress, admit_entrance, admit_peer_call, closes_connection,
                               complete, withdrawn)
from gateway.authority import Authority, request_namespace
from gateway.catchup import NeedsRegistry
from gateway.http import JSON, HTTPProtocol, status_response
from gateway.joinlimit import JoinRateLimit, client_address, token_id, trusted_networks
from gateway.protocol import ControlHandlers, JoinCall, PeerCall
from gateway.proxy import forward
from gateway.state import GatewayState


def _target(request: web.BaseRequest) -> bytes:
    # aiohttp decodes the target as UTF-8 with surrogate escapes: this gives back the bytes that came.
    return request.raw_path.encode("utf-8", "surrogateescape")


def _body_framing(request: web.BaseRequest) -> tuple[int | None, bool]:
    length = request.content_length
    return length, request.body_exists and length is None


class Entrance:
    """The entrance's requests that the raw path hands over: peer calls, requests with a body, anything odd."""

    def __init__(self, state: GatewayState, handlers: ControlHandlers) -> None:
        self.state = state
        self.handlers = handlers

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        state = self.state
        start = time.perf_counter()
        proto: HTTPProtocol = request.protocol  # type: ignore[assignment]
        client = ClientState()
        code = 500
        in_flight = state.accounting.in_flight["entrance"]
        in_flight.inc()
        try:
            if request.raw_path.startswith(PEER_PREFIX):
                resp = await self._peer_call(request, client, proto.peering_fp)
            else:
                length, chunked = _body_framing(request)
                decision = admit_entrance(state, client, proto.peering_fp, request.method.encode(),
                                          _target(request), request.raw_headers, length, chunked)
                admitted = await complete(state, client, decision)
                resp = await _held(state, request, client.authority, forward(state, request, "entrance", client.peer,
                                                                             state.api_pool, admitted),
                                   request_namespace(_target(request)) if admitted.watch else None)
            code = resp.status
            return resp
        except Refusal as refusal:
            code = refusal.code
            return status_response(refusal.code, refusal.reason, refusal.message, close=closes_connection(refusal),
                                   retry_after=refusal.retry_after)
        finally:
            in_flight.dec()
            state.accounting.finish("entrance", client.peer, client.capabilities, request.method, request.path, code,
                                    start)

    async def _peer_call(self, request: web.BaseRequest, client: ClientState, fp: str | None) -> web.StreamResponse:
        decision = admit_peer_call(self.state, client, fp, request.method, request.raw_path)
        if isinstance(decision, NeedsRegistry):
            decision = await decision.settle(self.state)
        peer, op = decision  # type: ignore[misc]
        body = None
        if request.method == "POST":
            body = await read_json(request, self.state.limits.max_peer_call_bytes)
        try:
            answer = await self.handlers.peer_call(PeerCall(peer=peer, op=op, body=body))
        except Refusal as err:
            return status_response(err.code, err.reason, err.message, retry_after=err.retry_after)
        return web.Response(body=json.dumps(answer).encode(), content_type=JSON)


class Egress:
    """A local consumer's request to a peer's API: reviewed here, then sent over mTLS to the peer's entrance."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        state = self.state
        start = time.perf_counter()
        client = ClientState()
        code = 500
        in_flight = state.accounting.in_flight["egress"]
        in_flight.inc()
        try:
            length, chunked = _body_framing(request)
            decision = admit_egress(state, client, request.method.encode(), _target(request), request.raw_headers,
                                    length, chunked)
            admitted = await complete(state, client, decision)
            pool = state.peer_pool(decision.peer)
            authority = Authority(decision.peer.name, frozenset(client.capabilities.split(",")), decision.account,
                                  decision.expires)
            resp = await _held(state, request, authority, forward(state, request, "egress", client.peer, pool,
                                                                  admitted))
            code = resp.status
            return resp
        except Refusal as refusal:
            code = refusal.code
            return status_response(refusal.code, refusal.reason, refusal.message)
        finally:
            in_flight.dec()
            state.accounting.finish("egress", client.peer, client.capabilities, request.method, request.path, code,
                                    start)


async def _held(state: GatewayState, request: web.BaseRequest, authority: Authority | None,
                forwarding: Coroutine[Any, Any, web.StreamResponse], namespace: str | None = None
                ) -> web.StreamResponse:
    """Forward while `state.streams` holds the request with what admitted it: when a registry or the token's
    expiry withdraws that, the client's connection is aborted (the handler is cancelled with it)."""
    key = object()
    transport = request.transport
    if authority is None or transport is None or not state.streams.add(key, authority, transport.abort,
                                                                         state.registry, namespace):
        forwarding.close()
        raise withdrawn()
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
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        raise Refusal(400, reasons.MALFORMED_BODY, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refusal(400, reasons.MALFORMED_BODY, "the body is not a JSON object")
    return body
