"""The aiohttp path's forwarding: an admitted request (admission.Admitted) goes through a pooled upstream
connection (upstream.UpstreamPool), its body streamed and bounded, and the answer comes back as an aiohttp
response: small ones in one write, others streamed (a watch as it comes)."""

from __future__ import annotations

import logging

from aiohttp import web

from contract import reasons
from contract.errors import Refusal
from gateway.accounting import CLIENT_CLOSED, INTERRUPTED, Outcome
from gateway.admission import Admitted
from gateway.framing import LENGTH, ResponseHead
from gateway.state import GatewayState
from gateway.status import upstream_refusal
from gateway.upstream import BodyStream, UpstreamError, UpstreamPool

log = logging.getLogger("gateway")

SMALL_BODY = 64 * 1024  # answers up to this size are sent in one write; larger ones stream


def _text(value: bytes) -> str:
    # As aiohttp's own parser decodes them, so that what is written back is the bytes that came.
    return value.decode("utf-8", "surrogateescape")


async def forward(state: GatewayState, request: web.BaseRequest, listener: str, peer: str, pool: UpstreamPool,
                  admitted: Admitted, outcome: Outcome) -> web.StreamResponse:
    """Send `admitted` (and the request's body) upstream and answer the client with what comes back; a Refusal
    when the upstream fails before answering. `outcome` learns the code the answer began with and how a streamed
    answer ended (interrupted by the upstream, or the client gone)."""
    limit = state.limits.max_body_bytes
    body = _bounded_body(request, limit) if request.body_exists else None
    chunked = request.body_exists and request.content_length is None
    result: list[web.StreamResponse] = []

    async def relay(head: ResponseHead, payload: BodyStream) -> None:
        headers = [(_text(n), _text(v)) for n, v in head.kept_fields()]
        if head.framing == LENGTH and head.length is not None and head.length <= SMALL_BODY:
            # Most API answers are small: one write of head and body, one TLS record, no chunk loop.
            data = await payload.read()
            result.append(web.Response(status=head.code, reason=head.reason, body=data, headers=headers))
            outcome.began(head.code)
            return
        resp = web.StreamResponse(status=head.code, reason=head.reason, headers=headers)
        if head.framing == LENGTH:
            resp.content_length = head.length
        result.append(resp)
        outcome.began(head.code)
        await resp.prepare(request)
        watches = state.metrics.watches.labels(listener, peer) if admitted.watch else None
        if watches is not None:
            watches.inc()
        try:
            while chunk := await payload.readany():
                await resp.write(chunk)
            await resp.write_eof()
        except UpstreamError as exc:
            # Headers are out: the only honest signal left is to cut the client's connection.
            outcome.ended(INTERRUPTED)
            state.accounting.upstream_error(listener, "stream")
            if request.transport is not None:
                request.transport.abort()
            log.info("upstream stream of %s ended early: %s", listener, exc.detail)
        except ConnectionError:
            # The client went away (it ended its watch): the upstream's stream is torn down with the connection.
            outcome.ended(CLIENT_CLOSED)
        finally:
            if watches is not None:
                watches.dec()

    try:
        await pool.request(admitted.head, body, head_only=request.method == "HEAD", chunked=chunked,
                           on_response=relay)
    except BodyTooLarge:
        raise Refusal(413, reasons.REQUEST_ENTITY_TOO_LARGE, f"the request body is larger than {limit} bytes") \
            from None
    except UpstreamError as err:
        if result:
            outcome.ended(INTERRUPTED)
            if request.transport is not None:
                request.transport.abort()
            return result[0]
        state.accounting.upstream_error(listener, err.kind)
        raise upstream_refusal(err, peer if listener == "egress" else None) from None
    return result[0]


class BodyTooLarge(Exception):
    pass


async def _bounded_body(request: web.BaseRequest, limit: int):
    seen = 0
    content = request.content
    while True:
        chunk = await content.readany()
        if not chunk:
            return
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        yield chunk
