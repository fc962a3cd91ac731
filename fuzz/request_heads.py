"""gateway/heads.py's request head reader: bytes in any split give the events of one piece, only requests the raw
path serves come out (a method of the allow-list, an origin-form target), and nothing raises. The events end at a
refusal (nothing is consumed after it) or at a request with a body (its bytes are the body reader's)."""

from __future__ import annotations

import atheris

with atheris.instrument_imports():
    from gateway.heads import METHODS, NEED_DATA, Refused, Request, RequestHeadReader

from fuzz.common import run

MAX_HEAD = 512


def _run(pieces: list[bytes]) -> tuple[list, bytes]:
    reader = RequestHeadReader(max_head_bytes=MAX_HEAD, max_headers=8)
    events: list = []
    ended = False
    for piece in pieces:
        reader.feed(piece)
        while not ended:
            event = reader.next_event()
            if event is NEED_DATA:
                break
            events.append(event)
            ended = isinstance(event, Refused) or (isinstance(event, Request) and event.has_body)
    return events, reader.take()


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    cuts = sorted(fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 6)))
    stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    whole = _run([stream])
    pieces, last = [], 0
    for cut in cuts:
        cut = min(cut, len(stream))
        pieces.append(stream[last:cut])
        last = max(last, cut)
    pieces.append(stream[last:])
    if _run(pieces) != whole:
        raise AssertionError(f"events differ with the split {cuts}")
    for event in whole[0]:
        if isinstance(event, Request) and (event.method not in METHODS or not event.target.startswith(b"/")):
            raise AssertionError(f"not a request the raw path serves: {event!r}")


def seeds():
    yield b"\x00" + b"GET /api/v1/namespaces/a/configmaps?watch=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\r\n\r\n"
    yield b"\x02\x10\x20" + b"GET / HTTP/1.1\r\nHost: a\r\n\r\nHEAD /x HTTP/1.1\r\nHost: a\r\n\r\n"
    yield b"\x00" + b"POST /peering/v1/offer HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"


if __name__ == "__main__":
    run(test_one_input, seeds)
