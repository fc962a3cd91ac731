"""The framing objects (gateway/framing.py) without sockets: bytes are fed, events asserted, as a playbook of
exact sequences (mitmproxy's Playbook tests are the model)."""

from __future__ import annotations

import pytest

from gateway.framing import (CHUNKED, LENGTH, NEED_DATA, NO_BODY, UNTIL_CLOSE, AmbiguousLength,
                             BodyTooLarge, Data, EndOfMessage, FramingError, Request, Refused, RequestBodyReader,
                             RequestHeadReader, ResponseFramer, ResponseHead, parse_request_head,
                             parse_response_head, relay_head, request_framing)


def reader(**kw) -> RequestHeadReader:
    return RequestHeadReader(max_head_bytes=kw.pop("max_head_bytes", 1024), max_headers=kw.pop("max_headers", 100),
                             **kw)


def events_of(framer: ResponseFramer, *chunks: bytes) -> list:
    """Feed `chunks` one by one; the events in order, the head shown as (code, framing, length, keep_alive)."""
    out = []
    for chunk in chunks:
        for event in framer.feed(chunk):
            out.append((event.code, event.framing, event.length, event.keep_alive)
                       if isinstance(event, ResponseHead) else event)
    return out


# ----- request heads ----------------------------------------------------------------------------------------------
def test_plain_request_head_is_parsed_into_raw_fields():
    head = b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer abc \r\nAccept: a, b"
    assert parse_request_head(head, 100) == Request(b"GET", b"/api/v1/pods?watch=1",
                                                    [(b"Host", b"x"), (b"Authorization", b"Bearer abc"),
                                                     (b"Accept", b"a, b")])
    assert parse_request_head(b"HEAD / HTTP/1.1", 100) == Request(b"HEAD", b"/", [])


@pytest.mark.parametrize("head, length, chunked", [
    (b"POST /api HTTP/1.1\r\nHost: x", None, False),
    (b"PUT /api HTTP/1.1\r\nContent-Length: 12", 12, False),
    (b"GET /api HTTP/1.1\r\nContent-Length: 0", 0, False),
    (b"PATCH /api HTTP/1.1\r\nTransfer-Encoding: chunked", None, True),
])
def test_requests_with_a_body_come_out_with_its_framing_and_the_body_left_in_the_buffer(head, length, chunked):
    request = parse_request_head(head, 100)
    assert (request.length, request.chunked, request.has_body) == (length, chunked, bool(length) or chunked)
    r = reader()
    r.feed(head + b"\r\n\r\nbody bytes")
    assert r.next_event() == request and r.take() == b"body bytes"


@pytest.mark.parametrize("head", [
    b"GET /api HTTP/1.0\r\nHost: x",                               # not HTTP/1.1
    b"POST /api HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked",  # smuggling shape
    b"POST /api HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2",  # framings it cannot read safely
    b"POST /api HTTP/1.1\r\nTransfer-Encoding: gzip",
    b"GET /api HTTP/1.1\r\nExpect: something-else",                 # an expectation it does not serve
    b"GET /api HTTP/1.1\r\nHost: x\r\n folded",                     # obs-fold
    b"GET /api HTTP/1.1\r\nBad Name: x",                            # not a token
    b"GET /api HTTP/1.1\r\nX: a\nInjected: b",                      # bare LF
    b"GET /api HTTP/1.1\r\nX: a\x00b",                              # control character
    b"GET api HTTP/1.1",                                            # not an origin-form target
    b"GET /a b HTTP/1.1",
    b"GET /api HTTP/1.1\r\n" + b"\r\n".join(b"X-%d: v" % i for i in range(101)),  # over max_headers
])
def test_any_other_request_is_refused_with_its_reason_and_nothing_consumed(head):
    refused = parse_request_head(head, 100)
    assert isinstance(refused, Refused) and refused.code in (400, 431)
    expected = ("RequestHeaderFieldsTooLarge" if b"X-100" in head else
                "AmbiguousBodyLength" if b"Transfer-Encoding" in head and b"Content-Length" in head
                else "MalformedRequest")
    assert refused.reason == expected and refused.message
    r = reader()
    r.feed(head + b"\r\n\r\n")
    assert r.next_event() == refused
    assert r.take() == head + b"\r\n\r\n"  # nothing consumed: the connection ends after the refusal


@pytest.mark.parametrize("head", [b"CONNECT api.x.lab:443 HTTP/1.1", b"TRACE /api HTTP/1.0", b"PROPFIND /api HTTP/1.1"])
def test_a_method_outside_the_kubernetes_api_is_refused_whatever_its_target_or_version(head):
    assert parse_request_head(head, 100) == Refused(405, "MethodNotAllowed", "")


def test_expect_100_continue_is_served_on_a_request_with_a_body():
    request = parse_request_head(b"PUT /api HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 2", 100)
    assert request.expects_continue and request.length == 2


def test_the_reader_waits_for_a_whole_head_and_serves_pipelined_requests_in_order():
    r = reader()
    first, second = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", b"DELETE /b HTTP/1.1\r\n\r\n"
    r.feed(first[:10])
    assert r.next_event() is NEED_DATA
    r.feed(first[10:] + second + b"GET /c HT")
    assert r.next_event() == Request(b"GET", b"/a", [(b"Host", b"x")])
    assert r.next_event() == Request(b"DELETE", b"/b", [])
    assert r.next_event() is NEED_DATA
    assert r.buffer == b"GET /c HT"


def test_the_reader_refuses_oversized_heads_as_soon_as_they_pass_the_limit():
    r = reader(max_head_bytes=64)
    r.feed(b"GET /a HTTP/1.1\r\nX-Big: " + b"a" * 80)
    assert r.next_event().code == 431  # no end in sight within the limit: refused without waiting for it
    r = reader(max_head_bytes=64)
    r.feed(b"GET /a HTTP/1.1\r\nX-Big: " + b"a" * 80 + b"\r\n\r\n")
    assert r.next_event().reason == "RequestHeaderFieldsTooLarge"
    r = reader()
    r.feed(b"GET /api HTTP/1.1\r\n\r\nGET /peering/v1/offer HTTP/1.1\r\n\r\n")
    assert r.next_event() == Request(b"GET", b"/api", [])
    assert r.next_event() == Request(b"GET", b"/peering/v1/offer", []) and r.next_event() is NEED_DATA


# ----- response heads ---------------------------------------------------------------------------------------------
def test_response_head_drops_hop_by_hop_fields_and_restates_framing():
    head = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, "
                               b"X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 12\r\nAudit-Id: 7",
                               False)
    assert relay_head(head) == (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nAudit-Id: 7\r\n"
                                b"Content-Length: 12\r\n\r\n")
    assert (head.code, head.keep_alive, head.length, head.framing, head.reason) == (200, True, 12, LENGTH, "OK")


def test_response_head_framing_cases():
    chunked = parse_response_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", False)
    assert relay_head(chunked).endswith(b"Transfer-Encoding: chunked\r\n\r\n") and chunked.keep_alive
    assert chunked.framing == CHUNKED
    until_close = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain", False)
    assert relay_head(until_close).endswith(b"Connection: close\r\n\r\n") and not until_close.keep_alive
    assert until_close.framing == UNTIL_CLOSE
    assert not parse_response_head(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1", False).keep_alive
    assert not parse_response_head(b"HTTP/1.0 200 OK\r\nContent-Length: 1", False).keep_alive
    head_only = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 99", True)
    assert relay_head(head_only).endswith(b"Content-Length: 99\r\n\r\n") and head_only.keep_alive
    assert head_only.framing == NO_BODY  # no body follows the answer to HEAD, whatever its Content-Length says
    no_content = parse_response_head(b"HTTP/1.1 204 No Content", False)
    assert (relay_head(no_content), no_content.code) == (b"HTTP/1.1 204 No Content\r\n\r\n", 204)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",  # smuggling shape
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked",                # a coding the client would not see
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
    b"HTTP/2 200 OK",
    b"HTTP/1.1 200 OK\r\nX: a\nY: b",
])
def test_response_heads_that_cannot_be_relayed_safely_are_refused(head):
    with pytest.raises(FramingError):
        parse_response_head(head, False)
    framer = ResponseFramer(decode=True)
    framer.start(False)
    with pytest.raises(FramingError):
        framer.feed(head + b"\r\n\r\n")


# ----- response bodies ----------------------------------------------------------------------------------------------
CHUNKED_BODY = b"5;ext=1\r\nhello\r\n1A\r\n" + b"z" * 26 + b"\r\n0\r\nTrailer-A: 1\r\n\r\n"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_content_length_answer_in_pieces():
    framer = ResponseFramer(decode=False)
    framer.start(False)
    assert events_of(framer, b"HTTP/1.1 200 OK\r\nContent-", b"Length: 5\r\n\r\nhe", b"llo") == [
        (200, LENGTH, 5, True), Data(b"he"), Data(b"llo"), EndOfMessage(True)]
    assert not framer.in_answer
    framer.start(True)  # the next exchange on the same connection: the answer to HEAD
    assert events_of(framer, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n") == [(200, NO_BODY, 5, True),
                                                                                EndOfMessage(True)]


def test_bytes_beyond_the_answer_or_unasked_for_never_let_the_connection_be_reused():
    framer = ResponseFramer(decode=False)
    framer.start(False)
    assert events_of(framer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA") == [
        (200, LENGTH, 2, True), Data(b"ok"), EndOfMessage(False)]
    with pytest.raises(FramingError, match="nobody asked"):
        framer.feed(b"more")
    idle = ResponseFramer(decode=True)
    with pytest.raises(FramingError):
        idle.feed(b"HTTP/1.1 200 OK\r\n\r\n")


def test_chunked_end_is_found_at_every_split_of_the_body():
    for cut in range(len(CHUNKED_BODY) + 1):
        framer = ResponseFramer(decode=False)
        framer.start(False)
        events = events_of(framer, CHUNKED_HEAD + CHUNKED_BODY[:cut])
        if cut < len(CHUNKED_BODY):
            events += events_of(framer, CHUNKED_BODY[cut:] + b"NEXT")
            # What follows the body's end in the same read forbids reuse.
            assert events[-1] == EndOfMessage(False), cut
        else:
            assert events[-1] == EndOfMessage(True)
            with pytest.raises(FramingError):
                framer.feed(b"NEXT")  # and after the answer, bytes nobody asked for
        assert events[0] == (200, CHUNKED, None, True), cut
        # Relayed as it came, up to the body's end and not a byte further.
        assert b"".join(e.data for e in events[1:-1]) == CHUNKED_BODY, cut


def test_chunked_end_is_found_byte_by_byte():
    framer = ResponseFramer(decode=False)
    framer.start(False)
    assert events_of(framer, CHUNKED_HEAD)[0] == (200, CHUNKED, None, True)
    results = [framer.feed(CHUNKED_BODY[i:i + 1]) for i in range(len(CHUNKED_BODY))]
    assert results[-1] == [Data(CHUNKED_BODY[-1:]), EndOfMessage(True)]
    assert all(r == [Data(CHUNKED_BODY[i:i + 1])] for i, r in enumerate(results[:-1]))


def test_decoding_gives_the_payload_alone():
    framer = ResponseFramer(decode=True)
    framer.start(False)
    events = events_of(framer, CHUNKED_HEAD + CHUNKED_BODY[:12], CHUNKED_BODY[12:])
    assert events[0] == (200, CHUNKED, None, True) and events[-1] == EndOfMessage(True)
    assert b"".join(e.data for e in events[1:-1]) == b"hello" + b"z" * 26


@pytest.mark.parametrize("body", [b"zz\r\nab\r\n", b"2\r\nabX\r\n", b"1" * 20 + b"\r\n", b"2;" + b"e" * 5000,
                                  b"2\nab\r\n"])  # the last: a bare LF where the client's parser may differ
def test_malformed_chunked_bodies_are_refused(body):
    for decode in (False, True):
        framer = ResponseFramer(decode=decode)
        framer.start(False)
        with pytest.raises(FramingError):
            framer.feed(CHUNKED_HEAD + body)


def test_the_upstream_closing_ends_only_an_answer_framed_by_its_close():
    framer = ResponseFramer(decode=False)
    framer.start(False)
    assert events_of(framer, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart1 ", b"part2") == [
        (200, UNTIL_CLOSE, None, False), Data(b"part1 "), Data(b"part2")]
    assert framer.feed_eof() == [EndOfMessage(False)]
    cut = ResponseFramer(decode=True)
    cut.start(False)
    cut.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part")
    with pytest.raises(FramingError, match="middle of the answer"):
        cut.feed_eof()  # never a truncated answer that looks whole
    silent = ResponseFramer(decode=True)
    silent.start(False)
    assert not silent.started
    with pytest.raises(FramingError, match="before answering"):
        silent.feed_eof()  # nothing came back: the request may be sent again on a fresh connection
    oversized = ResponseFramer(decode=True)
    oversized.start(False)
    with pytest.raises(FramingError, match="too large"):
        oversized.feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000)


def test_nothing_of_one_connections_head_carries_over_to_the_next():
    # llhttp refuses anything after a request that asked to close, or after an upgrade: the next head, of this
    # connection or another, is read all the same.
    for first in (b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n", b"GET /a HTTP/1.1\r\nConnection: Upgrade\r\n"
                  b"Upgrade: websocket\r\n\r\n", b"GET /a HTTP/1.0\r\n\r\n", b"POST /a HTTP/1.1\r\nContent-Length: 9\r\n\r\n",
                  b"GET /a HTTP/1.1\r\nBad Name: x\r\n\r\n"):
        one, other = reader(), reader()
        one.feed(first)
        one.next_event()
        other.feed(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        assert other.next_event() == Request(b"GET", b"/b", [(b"Host", b"x")]), first
    framer = ResponseFramer(decode=False)
    for head in (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"HTTP/1.1 200 OK\r\nConnection: close\r\n"
                 b"Content-Length: 0\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: a\nY: b\r\n\r\n"):
        try:
            parse_response_head(head[:-4], False)
        except FramingError:
            pass
        framer.start(False)
        assert events_of(framer, b"HTTP/1.1 204 No Content\r\n\r\n") == [(204, NO_BODY, None, True),
                                                                         EndOfMessage(True)], head


# ----- request bodies ---------------------------------------------------------------------------------------------
def body_of(reader: RequestBodyReader, *chunks: bytes) -> tuple[list, bytes]:
    """Feed `chunks` one by one: the events in order, and what followed the body."""
    events, rest = [], b""
    for chunk in chunks:
        got, rest = reader.feed(chunk)
        events += got
    return events, rest


REQUEST_CHUNKS = b"5\r\nhello\r\n1a;ext=1\r\n" + b"z" * 26 + b"\r\n0\r\n\r\n"


def test_a_content_length_body_ends_at_its_length_and_gives_back_the_next_request():
    body = RequestBodyReader(decode=False, limit=100)
    body.start(10, False)
    events, rest = body_of(body, b"01234", b"56789GET / HTTP/1.1\r\n")
    assert events == [Data(b"01234"), Data(b"56789"), EndOfMessage(True)] and rest == b"GET / HTTP/1.1\r\n"
    assert body.done
    body.start(0, False)  # reused for the next request: an empty body is complete at once
    assert body.done and body.feed(b"next") == ([], b"next")


@pytest.mark.parametrize("decode", [False, True])
def test_a_chunked_body_is_read_through_any_split_with_the_response_framers_chunk_reader(decode):
    whole = REQUEST_CHUNKS + b"PUT /next HTTP/1.1\r\n"
    for split in range(1, len(REQUEST_CHUNKS) + 1):
        body = RequestBodyReader(decode=decode, limit=31)
        body.start(None, True)
        events, rest = body_of(body, whole[:split], whole[split:])
        assert events[-1] == EndOfMessage(True) and rest == b"PUT /next HTTP/1.1\r\n", split
        payload = b"".join(e.data for e in events[:-1])
        assert payload == (b"hello" + b"z" * 26 if decode else REQUEST_CHUNKS), split


def test_a_body_over_the_limit_is_refused_before_its_bytes_are_read():
    with pytest.raises(BodyTooLarge, match="larger than 10 bytes"):
        RequestBodyReader(decode=False, limit=10).start(11, False)
    chunked = RequestBodyReader(decode=True, limit=10)
    chunked.start(None, True)
    chunked.feed(b"5\r\nhello\r\n")
    with pytest.raises(BodyTooLarge):
        chunked.feed(b"6\r\n")  # the chunk's size says it: its bytes are never waited for


@pytest.mark.parametrize("body", [b"zz\r\nab\r\n", b"2\r\nabX\r\n", b"1" * 20 + b"\r\n", b"2;" + b"e" * 5000,
                                  b"2\nab\r\n", b"0\r\nX-Smuggled: 1\r\n\r\n"])
def test_request_bodies_that_cannot_be_read_safely_are_refused(body):
    for decode in (False, True):
        reader = RequestBodyReader(decode=decode, limit=1 << 20)
        reader.start(None, True)
        with pytest.raises(FramingError):
            reader.feed(body)


@pytest.mark.parametrize("fields, framing", [
    ([(b"Host", b"x")], (None, False)),
    ([(b"Content-Length", b"12")], (12, False)),
    ([(b"content-length", b"12"), (b"Content-Length", b"12")], (12, False)),
    ([(b"Transfer-Encoding", b"Chunked")], (None, True)),
])
def test_request_framing_reads_one_length_or_chunked(fields, framing):
    assert request_framing(fields) == framing


@pytest.mark.parametrize("fields, error", [
    ([(b"Content-Length", b"12"), (b"Content-Length", b"13")], "bad Content-Length"),
    ([(b"Content-Length", b"-1")], "bad Content-Length"),
    ([(b"Content-Length", b"1" * 16)], "bad Content-Length"),
    ([(b"Transfer-Encoding", b"gzip, chunked")], "transfer coding"),
    ([(b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")], "transfer coding"),
    ([(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3")], "Content-Length with Transfer-Encoding"),
])
def test_request_framing_refuses_what_cannot_be_read_safely(fields, error):
    with pytest.raises(FramingError, match=error) as refused:
        request_framing(fields)
    assert isinstance(refused.value, AmbiguousLength) == ("with" in error)
