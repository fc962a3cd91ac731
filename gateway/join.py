"""The join listener (POST /v1/join), on aiohttp's low-level server (http.py): the joiner's call handed to the
control loop as a typed call (`protocol`), refused joins counted per address and token ID (joinlimit); every
refusal is a Kubernetes Status."""

from __future__ import annotations

import json
import time

from aiohttp import web

from contract import reasons
from contract.errors import Refusal
from contract.paths import JOIN_PATH
from gateway.calls import json_object
from gateway.http import JSON, status_response
from gateway.joinlimit import JoinRateLimit, client_address, token_id, trusted_networks
from gateway.protocol import ControlHandlers, JoinCall
from gateway.state import GatewayState


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
