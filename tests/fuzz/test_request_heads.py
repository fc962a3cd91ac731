"""The entrance's request head reader (gateway/heads.py) under arbitrary bytes: the same events whatever the
split, only requests the raw path can read safely come out of it, and it never raises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.heads import NEED_DATA, Refused, Request, RequestHeadReader, parse_request_head, request_framing

from tests.fuzz.strategies import FUZZ, splits

MAX_HEAD = 512
MAX_HEADERS = 8

methods = st.sampled_from([b"GET", b"HEAD", b"DELETE", b"OPTIONS", b"POST", b"PUT", b"PATCH", b"CONNECT",
                           b"TRACE", b"get", b"G\x00T", b""])
targets = st.sampled_from([b"/", b"/api/v1/namespaces/a/configmaps?watch=1", b"/peering/v1/offer", b"*",
                           b"http://x/", b"/a b", b"/\xff", b"//x", b"/%2e%2e/"]) | st.binary(max_size=12)
versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"http/1.1", b"HTTP/1.10"])
names = st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding", b"Expect", b"Connection",
                         b"Authorization", b"Upgrade", b"X", b"Bad Name", b"", b"Host\x00"])
values = st.sampled_from([b"a", b"0", b"5", b"chunked", b"100-continue", b"close", b"Bearer x", b" a ", b"\x7f",
                          b"a\rb", b"\xff"]) | st.binary(max_size=8)
line_ends = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r"])


@st.composite
def heads(draw) -> bytes:
    end = draw(line_ends)
    out = draw(methods) + b" " + draw(targets) + b" " + draw(versions) + end
    for _ in range(draw(st.integers(0, 10))):
        out += draw(names) + draw(st.sampled_from([b": ", b":", b" : ", b":\t"])) + draw(values) + draw(line_ends)
    if draw(st.booleans()):
        # Padded so that the head's end falls within a few bytes of the size limit, on either side of it.
        out += b"X: " + b"x" * max(0, MAX_HEAD - len(out) - 3 + draw(st.integers(-6, 6))) + b"\r\n"
    return out + draw(line_ends)


@st.composite
def plain_heads(draw) -> bytes:
    """A head the raw path serves, sometimes padded to end within a few bytes of the size limit."""
    out = (draw(st.sampled_from([b"GET", b"HEAD", b"DELETE", b"OPTIONS"])) + b" "
           + draw(st.sampled_from([b"/", b"/api/v1/pods?watch=1", b"/peering/v1/offer", b"/apis/x"]))
           + b" HTTP/1.1\r\nHost: a\r\n")
    if draw(st.booleans()):
        out += b"X: " + b"x" * max(0, MAX_HEAD - len(out) - 3 + draw(st.integers(-6, 6))) + b"\r\n"
    return out + b"\r\n"


streams = st.lists(plain_heads() | heads() | st.binary(max_size=64), min_size=1, max_size=4).map(b"".join)


def _reader() -> RequestHeadReader:
    return RequestHeadReader(max_head_bytes=MAX_HEAD, max_headers=MAX_HEADERS)


def _drain(reader: RequestHeadReader, out: list) -> bool:
    """Read events into `out` until the reader needs data (False) or refuses a head (True: the connection ends)."""
    while True:
        event = reader.next_event()
        if event is NEED_DATA:
            return False
        out.append(event)
        if isinstance(event, Refused):
            return True


def _run(pieces: list[bytes]) -> tuple[list, bytes]:
    reader, events, refused = _reader(), [], False
    for piece in pieces:
        reader.feed(piece)
        if not refused:
            refused = _drain(reader, events)
    return events, reader.take()


@FUZZ
@given(st.data(), streams)
def test_any_split_gives_the_events_of_one_piece(data, stream):
    whole = _run([stream])
    split = _run(data.draw(splits(stream)))
    assert split == whole


@FUZZ
@given(streams)
def test_only_requests_it_can_read_come_out_and_their_bytes_are_consumed(stream):
    events, rest = _run([stream])
    consumed = len(stream) - len(rest)
    for event in events:
        if isinstance(event, Refused):
            assert event.code in (400, 405, 431) and event.message
            continue
        assert isinstance(event, Request)
        assert event.target.startswith(b"/")
        assert all(0x21 <= c <= 0x7e for c in event.target)
        assert len(event.fields) <= MAX_HEADERS
        assert b"expect" not in {n.lower() for n, _ in event.fields}
        assert (event.length, event.chunked) == request_framing(event.fields)  # a framing it can read safely
    assert stream.endswith(rest) and consumed >= 0
    assert stream[:consumed].count(b"\r\n\r\n") >= sum(isinstance(e, Request) for e in events)


@FUZZ
@given(st.binary(max_size=300) | heads())
def test_parse_request_head_answers_a_request_or_none(head):
    result = parse_request_head(head.removesuffix(b"\r\n\r\n"), MAX_HEADERS)
    assert isinstance(result, (Refused, Request))


def test_a_head_whose_end_crosses_the_limit_is_read_the_same_in_pieces():
    # What the split property found, written out: a head whose CRLF CRLF starts within the limit and ends past it, cut
    # by a read inside the CRLF CRLF, was refused in pieces and served in one.
    head = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"x" * (MAX_HEAD - 30) + b"\r\n\r\n"
    assert head.find(b"\r\n\r\n") <= MAX_HEAD < len(head) - 1
    whole = _run([head])
    assert isinstance(whole[0][0], Request)
    for cut in range(len(head) - 4, len(head) + 1):
        assert _run([head[:cut], head[cut:]]) == whole, cut
