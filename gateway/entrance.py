"""The entrance's hot path: a raw-bytes HTTP/1.1 protocol for plain requests of a peer's consumers.

aiohttp's server builds a request object, a header multidict, a URL, a response object and a writer per request,
and its client side the same again; for a proxy whose answers are the upstream's own bytes that is most of the
CPU a request costs. This protocol reads the request head itself, applies the same rules (headers.py, tokens.py,
the verified-token and exchange caches), writes the rewritten head to a pooled upstream connection and relays the
answer as bytes, parsing only what framing needs: the response head, Content-Length or the chunked encoding's
end, so that both connections are reused.

Only the plainest requests take this path: HTTP/1.1, a method without a body (GET, HEAD, DELETE, OPTIONS), no
Content-Length, Transfer-Encoding or Expect, a head within the size limits and made of well-formed fields. For
anything else (bodies, peer calls under /peering/v1/, malformed or oversized heads, HTTP/1.0) the connection is
handed, from that request on, to the aiohttp server path, which answers it exactly as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from typing import TYPE_CHECKING, Any, Callable

from contract.paths import PEER_PREFIX
from contract import reasons
from gateway.headers import HOP_BY_HOP, bearer, request_head, screen_request
from contract.errors import Refusal
from gateway.status import status_body
from gateway.tls import connection_ended
from gateway.upstream import PooledIdle, TLSPool, UpstreamError

if TYPE_CHECKING:  # pragma: no cover
    from gateway.server import Gateway

_REQUEST_LINE = re.compile(rb"(GET|HEAD|DELETE|OPTIONS) (/[\x21-\x7e]*) HTTP/1\.1")
# A header field as RFC 9110 has it: a token name, a value of visible characters, spaces and tabs (no obs-fold).
_FIELD = rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e\x80-\xff]*(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)[ \t]*\r\n"
_FIELDS = re.compile(rb"(?:" + _FIELD + rb")*")
_FIELD_RE = re.compile(_FIELD)
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [\t\x20-\x7e\x80-\xff]*)?")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")
# Request headers that send a request down the aiohttp path: a body, or an interim answer to give.
_NOT_PLAIN = frozenset({b"content-length", b"transfer-encoding", b"expect"})
_RESPONSE_DROP = HOP_BY_HOP
_MAX_CHUNK_LINE = 4096
_MAX_RESPONSE_HEAD = 64 * 1024

# Framing states of an upstream answer.
_HEAD, _LENGTH, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


_PEER_PREFIX = PEER_PREFIX.encode()


def status_answer(code: int, cause: str, message: str, *, close: bool = False) -> bytes:
    """A whole HTTP/1.1 answer carrying a Kubernetes Status."""
    body = status_body(code, cause, message)
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        code, _REASONS.get(code, b"Error"), len(body), b"Connection: close\r\n" if close else b"", body)


_REASONS = {400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 413: b"Request Entity Too Large", 429: b"Too Many Requests",
            431: b"Request Header Fields Too Large", 500: b"Internal Server Error", 502: b"Bad Gateway",
            503: b"Service Unavailable"}


def parse_request_head(head: bytes, max_headers: int) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]] | None:
    """Method, target and fields of a plain request head (without its final CRLF CRLF), or None when the request
    is not one this path serves (the aiohttp path then answers it, refusals included)."""
    line_end = head.find(b"\r\n")
    line = head if line_end < 0 else head[:line_end]
    m = _REQUEST_LINE.fullmatch(line)
    if m is None:
        return None
    block = b"" if line_end < 0 else head[line_end + 2:] + b"\r\n"
    if _FIELDS.fullmatch(block) is None:
        return None
    fields = _FIELD_RE.findall(block)
    if len(fields) > max_headers:
        return None
    for name, _ in fields:
        if name.lower() in _NOT_PLAIN:
            return None
    return m.group(1), m.group(2), fields


def response_head(head: bytes, head_only: bool) -> tuple[bytes, int, int, bool, int]:
    """Parse an upstream response head (without its final CRLF CRLF). Returns the head to send to the client
    (hop-by-hop fields dropped, framing restated), the status code, the framing state, whether the upstream
    connection may be reused, and the body length for Content-Length framing. Raises ValueError when the
    answer cannot be relayed safely."""
    line_end = head.find(b"\r\n")
    line = head if line_end < 0 else head[:line_end]
    m = _STATUS_LINE.fullmatch(line)
    if m is None:
        raise ValueError("malformed status line")
    code = int(m.group(2))
    if code < 200:
        raise ValueError("interim answer")  # never asked for: Expect and upgrades are not forwarded
    block = b"" if line_end < 0 else head[line_end + 2:] + b"\r\n"
    if _FIELDS.fullmatch(block) is None:
        raise ValueError("malformed header field")
    fields = _FIELD_RE.findall(block)
    reuse = m.group(1) == b"1"
    named: set[bytes] = set()
    length: int | None = None
    coded = False
    for name, value in fields:
        low = name.lower()
        if low == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            named |= tokens
            if b"close" in tokens:
                reuse = False
        elif low == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                raise ValueError("bad Content-Length")
            length = int(value)
        elif low == b"transfer-encoding":
            # Only plain chunked framing is relayed: another coding (gzip, chunked) would have to be restated
            # exactly, and the API server never sends one.
            if coded or value.lower() != b"chunked":
                raise ValueError("unsupported transfer coding")
            coded = True
    out = [b"HTTP/1.1 ", line[9:], b"\r\n"]
    for name, value in fields:
        low = name.lower()
        if low in _RESPONSE_DROP or low in named:
            continue
        out += (name, b": ", value, b"\r\n")
    if head_only or code in (204, 304):
        if length is not None and code != 204:
            out.append(b"Content-Length: %d\r\n" % length)
        state, length = _DONE, 0
    elif coded:
        if length is not None:
            raise ValueError("Content-Length with Transfer-Encoding")
        out.append(b"Transfer-Encoding: chunked\r\n")
        state, length = _CHUNK_LINE, 0
    elif length is not None:
        out.append(b"Content-Length: %d\r\n" % length)
        state = _LENGTH if length else _DONE
    else:
        state, length, reuse = _UNTIL_CLOSE, 0, False
    if state == _UNTIL_CLOSE:
        out.append(b"Connection: close\r\n")  # the end of the body is the end of the client's connection too
    out.append(b"\r\n")
    return b"".join(out), code, state, reuse, length


class RelayPool(TLSPool["Relay"]):
    """Keep-alive TLS connections to one upstream for the raw path; each carries one exchange at a time."""

    async def connect(self) -> "Relay":
        return await self.open(lambda: Relay(self))


class Relay(PooledIdle, asyncio.Protocol):
    """One upstream TLS connection. During an exchange its bytes go to the owning EntranceProtocol's transport;
    the response head is rewritten once, the body is relayed as it comes, framing decides the end."""

    __slots__ = ("pool", "transport", "owner", "state", "remaining", "line", "head", "reuse", "got",
                 "last_read", "timer", "head_only", "idle_since")

    def __init__(self, pool: RelayPool) -> None:
        self.pool = pool
        self.transport: Any = None
        self.owner: EntranceProtocol | None = None
        self.state = _DONE
        self.remaining = 0
        self.line = b""
        self.head = b""
        self.reuse = False
        self.got = False
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.head_only = False
        self.idle_since = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def start(self, owner: "EntranceProtocol", head: bytes, head_only: bool) -> None:
        self.owner = owner
        self.state = _HEAD
        self.head = b""
        self.line = b""
        self.got = False
        self.head_only = head_only
        self.last_read = self.pool.loop.time()
        self._arm_idle()
        self.transport.write(head)

    def _exchanging(self) -> bool:
        # Only the wait for the first byte of the answer is timed; a streaming answer (a watch) may be silent.
        return self.owner is not None and not self.got

    def _idle_expired(self, why: str) -> None:
        self._fail(why)

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        if owner is None:
            if data and self.transport is not None:
                self.transport.abort()  # bytes nobody asked for: this connection is not reused
            return
        self.last_read = self.pool.loop.time()
        self.got = True
        out = b""
        if self.state == _HEAD:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > _MAX_RESPONSE_HEAD:
                    self._fail("the response head is too large")
                return
            try:
                out, code, self.state, self.reuse, self.remaining = response_head(self.head[:end], self.head_only)
            except ValueError as exc:
                self._fail(f"malformed response ({exc})")
                return
            owner.code = code
            if self.state == _UNTIL_CLOSE:
                owner.close_after = True  # the body ends when the upstream closes: so does the client's connection
            data = self.head[end + 4:]
            self.head = b""
            owner.response_started()
        state = self.state
        if state == _LENGTH:
            if len(data) < self.remaining:
                self.remaining -= len(data)
            else:
                if len(data) > self.remaining:
                    self.reuse = False  # more than the announced body: never reuse
                data = data[:self.remaining]
                self.remaining = 0
                self.state = _DONE
        elif state == _UNTIL_CLOSE:
            pass
        elif state != _DONE:
            try:
                end = self._scan_chunked(data)
            except ValueError:
                self._fail("malformed chunked body")
                return
            if end >= 0:
                if end < len(data):
                    self.reuse = False
                data = data[:end]
        elif data:
            self.reuse = False
            data = b""
        if out:
            owner.transport.write(out + data)
        elif data:
            owner.transport.write(data)
        if self.state == _DONE:
            self._done()

    def _scan_chunked(self, data: bytes) -> int:
        """Follow the chunked encoding through `data`; the index just past the body's end, or -1."""
        i, n = 0, len(data)
        while i < n:
            if self.state == _CHUNK_DATA:
                take = min(self.remaining, n - i)
                i += take
                self.remaining -= take
                if not self.remaining:
                    self.state = _CHUNK_CRLF
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > _MAX_CHUNK_LINE:
                    raise ValueError("chunk line too long")
                return -1
            line = self.line + data[i:j]
            self.line = b""
            i = j + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if self.state == _CHUNK_LINE:
                m = _CHUNK_SIZE.fullmatch(line)
                if m is None:
                    raise ValueError("bad chunk size")
                size = int(m.group(1), 16)
                if size:
                    self.state, self.remaining = _CHUNK_DATA, size
                else:
                    self.state = _TRAILER
            elif self.state == _CHUNK_CRLF:
                if line:
                    raise ValueError("chunk not followed by CRLF")
                self.state = _CHUNK_LINE
            elif not line:  # _TRAILER: an empty line ends the body
                self.state = _DONE
                return i
        return -1

    def _done(self) -> None:
        owner, self.owner = self.owner, None
        pool = self.pool
        if self.reuse and len(pool.idle) < pool.max_idle and self.transport is not None \
                and not self.transport.is_closing():
            pool.park(self)
        elif self.transport is not None:
            self.transport.abort()
        if owner is not None:
            owner.response_done()

    def _fail(self, detail: str) -> None:
        owner, self.owner = self.owner, None
        if self.transport is not None:
            self.transport.abort()
        if owner is not None:
            owner.upstream_failed(UpstreamError("request", detail), self.got)

    def detach(self) -> None:
        """The client went away mid-exchange: this connection's answer is unread, so it is dropped."""
        self.owner = None
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_idle()
        self.pool.all.discard(self)
        try:
            self.pool.idle.remove(self)
        except ValueError:
            pass
        self.transport = None
        if self.owner is not None:
            if self.state == _UNTIL_CLOSE:
                self.state = _DONE
                self.reuse = False
                self._done()
            else:
                self._fail("the upstream closed the connection")


class EntranceProtocol(asyncio.Protocol):
    """One mTLS client connection of the entrance, served on raw bytes until a request needs the aiohttp path."""

    __slots__ = ("gw", "fallback", "transport", "peering_fp", "_peering_on_lost", "buf",
                 "busy", "relay", "task", "close_after", "last", "timer", "paused", "code", "method", "path",
                 "peer", "caps", "start", "watch", "auth", "auth_hash", "handed", "reading_paused", "head",
                 "retried", "verified", "verified_caps")

    def __init__(self, gw: "Gateway", fallback: Callable[[], asyncio.Protocol]) -> None:
        self.gw = gw
        self.fallback = fallback
        self.transport: Any = None
        self.peering_fp: str | None = None
        self._peering_on_lost: Callable | None = None
        self.buf = b""
        self.busy = False
        self.relay: Relay | None = None
        self.task: asyncio.Task | None = None
        self.close_after = False
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.paused = False
        self.reading_paused = False
        self.code = 0
        self.method = b""
        self.path = b""
        self.peer = "-"
        self.caps = "-"
        self.start = 0.0
        self.watch = False
        self.auth = b""
        self.auth_hash = b""
        self.handed = False
        self.head = b""
        self.retried = False
        self.verified: Any = None
        self.verified_caps = "-"

    # ----- connection -------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        loop = self.gw.loop
        self.last = loop.time()
        self.timer = loop.call_at(self.last + self.gw.config.limits.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        self.timer = None
        if self.transport is None or self.handed:
            return
        due = self.last + self.gw.config.limits.idle_timeout
        if not self.busy and self.gw.loop.time() >= due:
            self.transport.close()  # an idle keep-alive connection: closed as the aiohttp path does
            return
        self.timer = self.gw.loop.call_at(max(due, self.gw.loop.time() + 1), self._idle_check)

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._next()
        elif len(self.buf) > self.gw.config.limits.max_header_bytes and not self.reading_paused:
            self.reading_paused = True  # a client sending ahead of its answers waits for them
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.paused = True
        if self.relay is not None:
            self.relay.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.relay is not None:
            self.relay.resume_reading()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.handed:
            return
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            self.task.cancel()
            self.task = None
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.detach()
        if self.busy:
            self.busy = False
            if self.watch and self.code:
                self.gw.metrics.watches.labels("entrance", self.peer).dec()
            self._finish(self.code if self.code else 499)
        connection_ended(self)

    # ----- requests ---------------------------------------------------------------------------------------
    def _next(self) -> None:
        limits = self.gw.config.limits
        while not self.busy and self.buf and self.transport is not None:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > limits.max_header_bytes:
                    self._handover()  # the aiohttp path answers the 431 or waits for the rest
                return
            if end > limits.max_header_bytes:
                self._handover()
                return
            parsed = parse_request_head(buf[:end], limits.max_headers)
            if parsed is None or parsed[1].startswith(_PEER_PREFIX):
                self._handover()
                return
            self.buf = buf[end + 4:]
            self.last = self.gw.loop.time()
            self._request(*parsed)
        if self.reading_paused and not self.busy and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    def _handover(self) -> None:
        """Give this connection, from the request at the start of the buffer on, to the aiohttp path."""
        gw = self.gw
        self.handed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        proto: Any = self.fallback()
        self._peering_on_lost = None
        gw._untrack(self)
        transport, self.transport = self.transport, None
        if self.reading_paused:
            transport.resume_reading()
        transport.set_protocol(proto)
        proto.connection_made(transport)
        gw._track(proto, self.peering_fp)
        buf, self.buf = self.buf, b""
        if buf:
            proto.data_received(buf)

    def _request(self, method: bytes, target: bytes, fields: list[tuple[bytes, bytes]]) -> None:
        gw = self.gw
        self.busy = True
        self.start = time.perf_counter()
        self.method, self.path = method, target
        self.code = 0
        self.caps = "-"
        self.retried = False
        self.close_after = False
        gw._in_flight["entrance"].inc()
        registry = gw._registry
        peer = registry.by_fingerprint.get(self.peering_fp)  # type: ignore[arg-type]
        self.peer = peer.name if peer is not None else "-"
        try:
            if peer is None:
                raise Refusal(403, reasons.PEER_UNKNOWN, "this client certificate belongs to no live peering of this "
                              "cluster; if the ClusterPeer was deleted, create the peering again")
            forward, auth, self.close_after = screen_request(fields)
            if auth is not None and auth == self.auth:
                token_hash = self.auth_hash  # the same header as this connection's last request
                token = ""
            else:
                token = bearer(auth.decode("latin-1") if auth is not None else None,
                               gw.config.limits.max_token_bytes)
                token_hash = hashlib.sha256(token.encode()).digest()
                self.auth = b""
            now = time.time()
            verified = gw._verified.get(token_hash)
            if verified is None or verified.peer != peer.name:
                if not token:
                    token = bearer(auth.decode("latin-1"), gw.config.limits.max_token_bytes)  # type: ignore[union-attr]
                verified = gw._verify_token(token, token_hash, peer, registry, now)
            elif verified.expires + gw.config.limits.token_skew <= now:
                gw._verified.pop(token_hash, None)
                raise Refusal(401, reasons.TOKEN_EXPIRED, "the token has expired; read the projected token file again")
            if auth is not None:
                self.auth, self.auth_hash = auth, token_hash
            if verified is not self.verified:  # the capabilities label, joined once per token, not per request
                self.verified, self.verified_caps = verified, ",".join(sorted(verified.capabilities))
            self.caps = self.verified_caps
            assert gw._exchange is not None
            exchanged = gw._exchange.cached(peer.connector_id, token_hash)
            head_only = method == b"HEAD"
            self.watch = b"watch" in target and _is_watch(target)
            if exchanged is not None:
                gw.metrics.exchange_hits.inc()
                head = request_head(method.decode(), gw._api_prefix + target.decode("latin-1"),
                                    gw._relay_pool.authority, forward,
                                    b"Bearer " + exchanged.encode(), None, False)
                self.head = head
                relay = gw._relay_pool.take()
                if relay is not None:
                    self._send(relay, head_only)
                    return
                self.task = gw.loop.create_task(self._slow(None, forward, head_only))
                return
            if not token:
                token = bearer(auth.decode("latin-1"), gw.config.limits.max_token_bytes)  # type: ignore[union-attr]
            not_after = time.monotonic() + (verified.expires - now)
            self.task = gw.loop.create_task(self._slow((peer.connector_id, token_hash, token, not_after), forward,
                                                       head_only))
        except Refusal as refusal:
            self._refuse(refusal)

    async def _slow(self, exchange: tuple | None, forward: list[tuple[bytes, bytes]], head_only: bool) -> None:
        """The parts of a request that wait: a token exchange at Dex, a new upstream connection."""
        gw = self.gw
        try:
            if exchange is not None:
                assert gw._exchange is not None
                connector, token_hash, token, not_after = exchange
                exchanged = await gw._exchange.get(connector, token_hash, token, not_after=not_after)
                self.head = request_head(self.method.decode(), gw._api_prefix + self.path.decode("latin-1"),
                                         gw._relay_pool.authority, forward,
                                         b"Bearer " + exchanged.encode(), None, False)
            relay = gw._relay_pool.take() or await gw._relay_pool.connect()
        except Refusal as refusal:
            self.task = None
            self._refuse(refusal)
            return
        except UpstreamError as err:
            self.task = None
            self._upstream_refusal(err)
            return
        self.task = None
        if self.transport is None:
            gw._relay_pool.park(relay)
            return
        self._send(relay, head_only)

    def _send(self, relay: Relay, head_only: bool) -> None:
        self.relay = relay
        relay.start(self, self.head, head_only)
        if self.paused:
            relay.pause_reading()

    # ----- callbacks of the relay ---------------------------------------------------------------------------
    def response_started(self) -> None:
        self.head = b""  # kept only to retry on a fresh connection before any answer; a watch holds no copy
        if self.watch:
            self.gw.metrics.watches.labels("entrance", self.peer).inc()

    def response_done(self) -> None:
        relay, self.relay = self.relay, None
        if relay is not None and self.paused:
            relay.resume_reading()
        if self.watch and self.code:
            self.gw.metrics.watches.labels("entrance", self.peer).dec()
        self._end(self.code)

    def upstream_failed(self, err: UpstreamError, got: bool) -> None:
        self.relay = None
        if self.code:
            # The answer had started: the only honest signal left is to cut the client's connection.
            self.gw.metrics.upstream_errors.labels("entrance", "stream").inc()
            if self.watch:
                self.gw.metrics.watches.labels("entrance", self.peer).dec()
            code = self.code
            self.busy = False
            self._finish(code)
            if self.transport is not None:
                self.transport.abort()
            return
        if not got and not self.retried:
            # A pooled connection the upstream had closed meanwhile: retry once on a new one.
            self.retried = True
            self.task = self.gw.loop.create_task(self._slow(None, [], self.method == b"HEAD"))
            return
        self._upstream_refusal(err)

    def _upstream_refusal(self, err: UpstreamError) -> None:
        self.gw.metrics.upstream_errors.labels("entrance", err.kind).inc()
        if err.kind == "connect":
            self._refuse(Refusal(503, reasons.UPSTREAM_UNAVAILABLE, f"the upstream API server cannot be reached "
                                 f"({err.detail}); retry later"))
        else:
            self._refuse(Refusal(502, reasons.UPSTREAM_FAILED, f"the upstream API server failed the request "
                                 f"({err.detail}); retry"))

    # ----- answers ------------------------------------------------------------------------------------------
    def _refuse(self, refusal: Refusal) -> None:
        close = refusal.reason in (reasons.PEER_UNKNOWN, reasons.UPGRADE_REFUSED)
        if self.transport is not None:
            self.transport.write(status_answer(refusal.code, refusal.reason, refusal.message,
                                               close=close or self.close_after))
        if close:
            self.close_after = True
        self._end(refusal.code)

    def _end(self, code: int) -> None:
        self.busy = False
        self._finish(code)
        self.last = self.gw.loop.time()
        if self.transport is None:
            return
        if self.close_after:
            self.transport.close()
            return
        if self.buf:
            self._next()
        elif self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def _finish(self, code: int) -> None:
        self.gw._in_flight["entrance"].dec()
        self.gw._finish("entrance", self.peer, self.caps, self.method.decode(),
                        self.path.split(b"?", 1)[0].decode("latin-1"), code, self.start)


def _is_watch(target: bytes) -> bool:
    query = target.partition(b"?")[2]
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"watch" and value.lower() in (b"1", b"true", b"t", b"yes"):
            return True
    return False
