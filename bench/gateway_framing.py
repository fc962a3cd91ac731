"""The candidates for the data plane's HTTP/1.1 framing, measured on the raw path's work and checked on the
smuggling shapes it must not pass:

    python -m bench.gateway_framing [iterations]

- gateway/framing.py as it is: llhttp through httptools, with the module's own checks and events on top;
- the regex heads the gateway read before (bench/gateway_framing_regex.py: its own head parsing, the gateway's
  reader and framer);
- h11 (pure Python, h11's readers), one connection object per client or upstream connection, cycled per request;
- httptools bare (llhttp, the C parser of Node.js), one parser per connection, callbacks only: what the module's
  checks and events cost on top of it.

Per candidate: microseconds of CPU (best of seven rounds) to read the request head of a kubectl GET (with a projected token), to frame a small
Content-Length answer, and a chunked watch answer of 20 events; then which of the malformed or ambiguous inputs
it accepted (it should refuse all, or for requests hand them to the strict path). h11 is not a dependency of the
module: when missing it is reported and skipped (`pip install h11` to compare).
"""

from __future__ import annotations

import inspect

import sys
import time
import timeit

from gateway.framing import Data, EndOfMessage, FramingError, Request, RequestHeadReader, ResponseFramer, ResponseHead

TOKEN = "eyJ" + "a" * 900
REQUEST = (b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: peering-gateway.x.lab\r\nAuthorization: Bearer "
           + TOKEN.encode() + b"\r\nUser-Agent: kubectl/v1.30\r\nAccept: application/json, */*\r\n\r\n")
BODY = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}'
RESPONSE = (b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 30 Nov 2026 02:00:00 GMT\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n" % len(BODY)) + BODY
EVENT = b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"pod-1","resourceVersion":"7"}}}\n'
WATCH = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
         + b"".join(b"%x\r\n%s\r\n" % (len(EVENT), EVENT) for _ in range(20)) + b"0\r\n\r\n")

BAD_REQUESTS = {
    "Content-Length and Transfer-Encoding": b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    "bare LF in a field": b"GET / HTTP/1.1\r\nX: a\nInjected: b\r\n\r\n",
    "obs-fold": b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
    "space before the colon": b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
    "NUL in a value": b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    "two Content-Lengths": b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
}
BAD_RESPONSES = {
    "Content-Length and Transfer-Encoding": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    "two Content-Lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    "gzip, chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "bare LF in a field": b"HTTP/1.1 200 OK\r\nX: a\nY: b\r\nContent-Length: 0\r\n\r\n",
    "bare LF after a chunk size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nab\r\n0\r\n\r\n",
    "obs-fold": b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "negative Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
}


# ----- own ---------------------------------------------------------------------------------------------------------
class Own:
    """gateway/framing.py (or the regex one before it), relaying (the raw path) or decoding (the aiohttp path and
    the egress)."""

    def __init__(self, module, label: str, decode: bool) -> None:
        self.name = f"{label}, {'decoding' if decode else 'relaying'}"
        # Relaying, the llhttp framer re-frames chunked bodies chunk by chunk; the regex one relayed them as they
        # came: both count the body bytes they hand on.
        self.decodes = decode
        # The regex reader before handed peer calls over; the one engine reads them itself.
        handover = {"handover_prefix": b"/peering/v1/"} if "handover_prefix" in inspect.signature(
            module.RequestHeadReader).parameters else {}
        self.reader = module.RequestHeadReader(max_head_bytes=32768, max_headers=100, **handover)
        self.framer = module.ResponseFramer(decode=decode)

    def request(self, data: bytes) -> bool:
        """True when the head was read as a request this path serves."""
        self.reader.feed(data)
        event = self.reader.next_event()
        self.reader.take()
        return isinstance(event, Request)

    def expected(self, data: bytes, payload: int) -> int:
        return payload if self.decodes or b"chunked" not in data else len(data) - data.index(b"\r\n\r\n") - 4

    def response(self, data: bytes) -> int:
        """Body bytes framed; FramingError (ValueError) when refused."""
        framer = self.framer
        framer.start(False)
        n = 0
        done = False
        for event in framer.feed(data):
            if type(event) is Data:
                n += len(event.data)
            elif type(event) is EndOfMessage:
                done = True
            elif type(event) is not ResponseHead:
                raise AssertionError(event)
        if not done:
            raise ValueError("the answer did not end")
        return n


# ----- h11 ---------------------------------------------------------------------------------------------------------
class H11:
    name = "h11"
    decodes = True

    def __init__(self) -> None:
        import h11
        self.h11 = h11
        self.server = h11.Connection(h11.SERVER)
        self.client = h11.Connection(h11.CLIENT)
        self.answer = h11.Response(status_code=200, headers=[("Content-Length", "0")])

    def request(self, data: bytes) -> bool:
        h11 = self.h11
        conn = self.server
        try:
            conn.receive_data(data)
            event = conn.next_event()
            ok = isinstance(event, h11.Request) and event.method in (b"GET", b"HEAD", b"DELETE", b"OPTIONS") \
                and not any(n in (b"content-length", b"transfer-encoding") for n, _ in event.headers)
            if isinstance(event, h11.Request):
                conn.next_event()  # its EndOfMessage
        except h11.RemoteProtocolError:
            self.server = h11.Connection(h11.SERVER)
            return False
        conn.send(self.answer)  # a server must answer before it reads the next request
        conn.send(h11.EndOfMessage())
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            self.server = h11.Connection(h11.SERVER)
        return ok

    def response(self, data: bytes) -> int:
        h11 = self.h11
        conn = self.client
        conn.send(h11.Request(method="GET", target="/api", headers=[("Host", "api")]))
        conn.send(h11.EndOfMessage())
        n = 0
        try:
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if isinstance(event, h11.Data):
                    n += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif event is h11.NEED_DATA:
                    raise ValueError("the answer did not end")
            conn.start_next_cycle()
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ValueError) as exc:
            self.client = h11.Connection(h11.CLIENT)
            raise ValueError(str(exc)) from None
        return n


# ----- httptools ---------------------------------------------------------------------------------------------------
class HTTPTools:
    name = "httptools bare (llhttp)"
    decodes = True

    def __init__(self) -> None:
        import httptools
        self.httptools = httptools
        self.req = _RequestCallbacks()
        self.rsp = _ResponseCallbacks()
        self.request_parser = httptools.HttpRequestParser(self.req)
        self.response_parser = httptools.HttpResponseParser(self.rsp)

    def request(self, data: bytes) -> bool:
        self.req.reset()
        try:
            self.request_parser.feed_data(data)
        except self.httptools.HttpParserError:
            self.request_parser = self.httptools.HttpRequestParser(self.req)
            return False
        method = self.request_parser.get_method()
        return self.req.complete and method in (b"GET", b"HEAD", b"DELETE", b"OPTIONS") \
            and not any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in self.req.fields)

    def response(self, data: bytes) -> int:
        self.rsp.reset()
        try:
            self.response_parser.feed_data(data)
        except self.httptools.HttpParserError as exc:
            self.response_parser = self.httptools.HttpResponseParser(self.rsp)
            raise ValueError(str(exc)) from None
        if not self.rsp.complete:
            self.response_parser = self.httptools.HttpResponseParser(self.rsp)
            raise ValueError("the answer did not end")
        return self.rsp.body


class _RequestCallbacks:
    def reset(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.url = b""
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_message_complete(self) -> None:
        self.complete = True


class _ResponseCallbacks:
    def reset(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.body = 0
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += len(body)

    def on_message_complete(self) -> None:
        self.complete = True


def candidates() -> list:
    from bench import gateway_framing_regex
    from gateway import framing
    out: list = [Own(framing, "gateway/framing.py (llhttp)", decode=False),
                 Own(framing, "gateway/framing.py (llhttp)", decode=True),
                 Own(gateway_framing_regex, "regex (before)", decode=False),
                 Own(gateway_framing_regex, "regex (before)", decode=True)]
    for make in (H11, HTTPTools):
        try:
            out.append(make())
        except ImportError as exc:
            print(f"{make.name}: not installed ({exc.name}); pip install h11 httptools to compare", file=sys.stderr)
    return out


def measure(candidate, iterations: int) -> dict[str, float]:
    if not candidate.request(REQUEST):
        raise SystemExit(f"{candidate.name} did not read the plain request: the measurement is void")
    for data, payload in ((RESPONSE, len(BODY)), (WATCH, 20 * len(EVENT))):
        body = candidate.expected(data, payload) if isinstance(candidate, Own) else payload
        if candidate.response(data) != body:
            raise SystemExit(f"{candidate.name} framed a wrong body: the measurement is void")

    def best(fn) -> float:
        # CPU time of this process, best of seven: on a shared machine, time spent waiting for a core is not
        # the candidate's.
        return min(timeit.repeat(fn, number=iterations, repeat=7, timer=time.process_time)) / iterations * 1e6

    return {"request head": best(lambda: candidate.request(REQUEST)),
            "small answer": best(lambda: candidate.response(RESPONSE)),
            "watch answer (20 events)": best(lambda: candidate.response(WATCH))}


def accepted(candidate) -> list[str]:
    """The bad inputs the candidate let through."""
    passed = [f"request: {name}" for name, data in BAD_REQUESTS.items() if candidate.request(data)]
    for name, data in BAD_RESPONSES.items():
        try:
            candidate.response(data)
        except (ValueError, FramingError):
            continue
        passed.append(f"response: {name}")
    return passed


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for candidate in candidates():
        figures = measure(candidate, iterations)
        shown = ", ".join(f"{k} {v:.2f} us" for k, v in figures.items())
        bad = accepted(candidate)
        print(f"{candidate.name}: {shown}; accepted {len(bad)} bad input(s){': ' + '; '.join(bad) if bad else ''}")


if __name__ == "__main__":
    main()
