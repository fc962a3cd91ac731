"""The data plane's response framer (gateway/framing.py) under arbitrary upstream bytes: the same events whatever
the split, no exception but FramingError, and never more body than the answer declared."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.framing import CHUNKED, LENGTH, Data, EndOfMessage, FramingError, ResponseFramer, ResponseHead

from tests.fuzz.strategies import FUZZ, splits

statuses = st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 204 No Content", b"HTTP/1.1 304 Not Modified",
                            b"HTTP/1.0 200 OK", b"HTTP/1.1 100 Continue", b"HTTP/1.1 101 Switching", b"HTTP/2 200",
                            b"HTTP/1.1 999 X", b"HTTP/1.1 200", b"HTTP/1.1 20 OK", b"XTTP/1.1 200 OK"])
fields = st.lists(st.sampled_from([
    b"Content-Length: 0", b"Content-Length: 5", b"Content-Length: 17", b"Content-Length: 5, 5",
    b"Content-Length: -1", b"Content-Length: 99999999999999999999", b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip, chunked", b"Transfer-Encoding: Chunked", b"Connection: close",
    b"Connection: keep-alive", b"Content-Type: application/json", b"Bad Field: x", b"X:\xff",
]), max_size=4)


@st.composite
def chunked_bodies(draw) -> tuple[bytes, bytes]:
    """A chunked body on the wire and its payload; sometimes broken."""
    wire, payload = b"", b""
    for chunk in draw(st.lists(st.binary(min_size=1, max_size=20), max_size=4)):
        ext = draw(st.sampled_from([b"", b";a=b", b" ", b"\t;x"]))
        wire += b"%x" % len(chunk) + ext + b"\r\n" + chunk + b"\r\n"
        payload += chunk
    wire += b"0\r\n" + draw(st.sampled_from([b"", b"Trailer: x\r\n"])) + b"\r\n"
    return wire, payload


@st.composite
def answers(draw) -> bytes:
    head = draw(statuses) + b"\r\n" + b"".join(f + b"\r\n" for f in draw(fields)) + b"\r\n"
    body = draw(st.one_of(st.binary(max_size=40), chunked_bodies().map(lambda b: b[0])))
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(body)))
        body = body[:cut] + draw(st.binary(max_size=6)) + body[cut:]  # a byte too many or broken framing
    return head + body


streams = answers() | st.binary(max_size=120)
ERROR = ("error",)


def _run(pieces: list[bytes], head_only: bool, decode: bool):
    """Feed the pieces and then the end of the stream as relay.py and upstream.py do: after the end of the answer,
    more bytes mean the connection is not reused. ERROR for a FramingError, else the events with the
    body joined, and whether the connection may be reused."""
    framer = ResponseFramer(decode=decode)
    framer.start(head_only)
    events: list = []
    ended = None
    extra = False
    try:
        for piece in pieces:
            if ended is not None:
                extra = extra or bool(piece)
                continue
            events += framer.feed(piece)
            ended = next((e for e in events if isinstance(e, EndOfMessage)), None)
        if ended is None:
            events += framer.feed_eof()
            ended = next((e for e in events if isinstance(e, EndOfMessage)), None)
    except FramingError as exc:
        assert str(exc)  # a FramingError always says what was wrong
        return ERROR
    heads = [e for e in events if isinstance(e, ResponseHead)]
    body = b"".join(e.data for e in events if isinstance(e, Data))
    assert all(isinstance(e, (ResponseHead, Data, EndOfMessage)) for e in events)
    assert len(heads) <= 1 and (not heads or events[0] is heads[0])
    described = [(h.code, h.status, h.fields, h.framing, h.length, h.keep_alive) for h in heads]
    reuse = None if ended is None else (ended.reuse and not extra)
    return described, body, reuse


@pytest.mark.parametrize("decode", [False, True], ids=["relay", "decode"])
@pytest.mark.parametrize("head_only", [False, True], ids=["GET", "HEAD"])
@FUZZ
@given(data=st.data(), stream=streams)
def test_any_split_gives_the_events_of_one_piece(data, stream, head_only, decode):
    whole = _run([stream], head_only, decode)
    split = _run(data.draw(splits(stream)), head_only, decode)
    if whole == ERROR or split == ERROR:
        # An error may come sooner in pieces (the first bytes of a bad chunk line), never only in one of the two.
        assert whole == split == ERROR
        return
    whole_body, split_body = whole[1], split[1]
    # A body framed by the close of the connection ends where the bytes end: the same in both.
    assert split[0] == whole[0] and split_body == whole_body and split[2] == whole[2]


@FUZZ
@given(stream=answers(), decode=st.booleans())
def test_never_more_body_than_declared(stream, decode):
    result = _run([stream], False, decode)
    if result == ERROR or not result[0]:
        return
    (code, _, _, framing, length, _), body, reuse = result[0][0], result[1], result[2]
    head_end = stream.index(b"\r\n\r\n") + 4
    after = stream[head_end:]
    if framing == LENGTH:
        assert len(body) <= length and (reuse is None or len(body) == length)
        assert body == after[:len(body)]
    elif framing == CHUNKED and not decode:
        assert after.startswith(body)  # relayed as it came, never a byte past the body's end
    elif framing == CHUNKED:
        assert len(body) <= len(after)


@FUZZ
@given(chunked_bodies(), st.data())
def test_a_chunked_body_decodes_to_its_payload_in_any_split(body, data):
    wire, payload = body
    stream = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + wire
    for decode in (False, True):
        result = _run(data.draw(splits(stream)), False, decode)
        assert result != ERROR
        assert result[1] == (payload if decode else wire) and result[2] is True
