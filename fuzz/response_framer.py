"""gateway/framing.py's response framer, relaying and decoding: bytes in any split give the events of one piece,
only FramingError is raised, and a Content-Length body is never longer than declared."""

from __future__ import annotations

import atheris

with atheris.instrument_imports():
    from gateway.framing import LENGTH, Data, EndOfMessage, FramingError, ResponseFramer, ResponseHead

from fuzz.common import run

ERROR = ("error",)


def _run(pieces: list[bytes], head_only: bool, decode: bool):
    framer = ResponseFramer(decode=decode)
    framer.start(head_only)
    events: list = []
    end = None
    extra = False
    try:
        for piece in pieces:
            if end is not None:
                extra = extra or bool(piece)  # after the answer: the connection is not reused (relay.py)
                continue
            events += framer.feed(piece)
            end = next((e for e in events if isinstance(e, EndOfMessage)), None)
        if end is None:
            events += framer.feed_eof()
            end = next((e for e in events if isinstance(e, EndOfMessage)), None)
    except FramingError:
        return ERROR
    heads = [(h.code, h.status, h.fields, h.framing, h.length, h.keep_alive)
             for h in events if isinstance(h, ResponseHead)]
    body = b"".join(e.data for e in events if isinstance(e, Data))
    if heads and heads[0][3] == LENGTH and len(body) > heads[0][4]:
        raise AssertionError("more body than the Content-Length declared")
    return heads, body, None if end is None else end.reuse and not extra


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    head_only, decode = fdp.ConsumeBool(), fdp.ConsumeBool()
    cuts = sorted(fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 6)))
    stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    pieces, last = [], 0
    for cut in cuts:
        cut = min(cut, len(stream))
        pieces.append(stream[last:cut])
        last = max(last, cut)
    pieces.append(stream[last:])
    whole, split = _run([stream], head_only, decode), _run(pieces, head_only, decode)
    if (whole == ERROR) != (split == ERROR) or (whole != ERROR and whole != split):
        raise AssertionError(f"events differ with the split {cuts}: {whole!r} != {split!r}")


def seeds():
    yield b"\x00\x00\x00" + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    yield b"\x00\x01\x02\x08\x10" + b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: v\r\n\r\n"
    yield b"\x01\x00\x00" + b"HTTP/1.0 304 Not Modified\r\nContent-Length: 9\r\n\r\n"
    yield b"\x00\x00\x00" + b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"


if __name__ == "__main__":
    run(test_one_input, seeds)
