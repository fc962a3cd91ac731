"""The HTTP edge of the join and ops listeners: aiohttp's low-level server with parse errors answered as Status
(the entrance and the egress are the engine's, engine.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from aiohttp import web, web_protocol, web_server
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong

from contract import reasons
from gateway.heads import AMBIGUOUS_MESSAGE, MALFORMED_MESSAGE, TOO_LARGE_MESSAGE
from gateway.status import status_answer, status_body

log = logging.getLogger("gateway")

JSON = "application/json"


def status_response(code: int, cause: str, message: str, *, close: bool = False,
                    retry_after: int | None = None) -> web.Response:
    resp = web.Response(status=code, body=status_body(code, cause, message, retry_after), content_type=JSON)
    if retry_after is not None:
        resp.headers["Retry-After"] = str(retry_after)
    if close:
        resp.force_close()
    return resp


def parse_error_status(status: int, exc: BaseException | None) -> tuple[int, str, str]:
    """Code, cause and message for a request the HTTP parser refused."""
    text = str(exc) if exc is not None else ""
    if isinstance(exc, LineTooLong) or "too many headers" in text.lower() or "header value is too long" in text.lower():
        return 431, reasons.REQUEST_HEADER_FIELDS_TOO_LARGE, TOO_LARGE_MESSAGE
    lowered = text.lower()
    if "transfer-encoding" in lowered and "content-length" in lowered:
        return 400, reasons.AMBIGUOUS_BODY_LENGTH, AMBIGUOUS_MESSAGE
    if isinstance(exc, BadHttpMessage):
        return 400, reasons.MALFORMED_REQUEST, MALFORMED_MESSAGE + text[:200]
    if status == 500:
        return 500, reasons.INTERNAL_ERROR, "the gateway failed to answer this request; it is logged"
    return status, reasons.MALFORMED_REQUEST, "the request is not valid HTTP/1.1"


class HTTPProtocol(web_protocol.RequestHandler):
    """One HTTP/1.1 connection of the join or the ops listener.

    A request head must be complete within `head_timeout` seconds of its first bytes (of the connection, or after
    the previous request's handler): a client trickling one is answered 408 and closed. `on_refused` is told of
    each request refused before a handler could see it (a parse error, a head too slow): code, reason."""

    _head_timer: asyncio.TimerHandle | None = None
    _in_handler: bool = False

    def __init__(self, manager: web_server.Server, *, head_timeout: float,
                 on_refused: Callable[["HTTPProtocol", int, str], None] | None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.head_timeout = head_timeout
        self.on_refused = on_refused

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and not self._in_handler and data:
            self._head_timer = asyncio.get_running_loop().call_later(self.head_timeout, self._head_late)
        super().data_received(data)

    def head_received(self) -> None:
        """A request head is complete: its handler runs (with a body, as slowly as the body limits allow)."""
        self._in_handler = True
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def handler_done(self) -> None:
        self._in_handler = False

    def _head_late(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or self._in_handler:
            return
        transport.write(status_answer(408, reasons.REQUEST_TIMEOUT, f"the request head was not complete within "
                                      f"{self.head_timeout:g} s; send the whole head at once", close=True))
        transport.close()
        if self.on_refused is not None:
            self.on_refused(self, 408, reasons.REQUEST_TIMEOUT)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0 or isinstance(exc, ConnectionError):
            # The answer had begun, or the client is gone: nothing can be said any more but closing.
            raise ConnectionError("the response had started when the request failed; the connection is closed")
        code, cause, text = parse_error_status(status, exc)
        if code == 500 and exc is not None:
            # The traceback names code, not request data; the request's headers (tokens) are never logged.
            log.error("request failed inside the gateway: %s", type(exc).__name__, exc_info=exc)
        if isinstance(exc, HttpProcessingError) and self.on_refused is not None:
            self.on_refused(self, code, cause)  # refused by the parser: no handler saw it (handlers account theirs)
        return status_response(code, cause, text, close=True)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


class HTTPServer(web_server.Server):
    """aiohttp's low-level server (no router, no middlewares) making HTTPProtocol connections; `head_timeout`
    bounds the time a request head may take to arrive, and `on_refused` hears of the requests refused before
    the handler (accounting)."""

    def __init__(self, handler: Callable, *, head_timeout: float = 10.0,
                 on_refused: Callable[[HTTPProtocol, int, str], None] | None = None, **kwargs: Any) -> None:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            proto: HTTPProtocol = request.protocol  # type: ignore[assignment]
            proto.head_received()
            try:
                return await handler(request)
            finally:
                proto.handler_done()

        super().__init__(handle, handler_cancellation=True, access_log=None, **kwargs)
        self.head_timeout = head_timeout
        self.on_refused = on_refused

    def __call__(self) -> HTTPProtocol:
        return HTTPProtocol(self, loop=self._loop, head_timeout=self.head_timeout, on_refused=self.on_refused,
                            **self._kwargs)

