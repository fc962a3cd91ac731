"""What every harness shares: seeds for an empty corpus, then libFuzzer's loop over `test_one_input`."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable


def _corpus_dir(argv: list[str]) -> str | None:
    dirs = [a for a in argv[1:] if not a.startswith("-")]
    return dirs[0] if dirs else None


def text_of(data: bytes) -> str | None:
    """The text a JSON string could carry for `data`: UTF-8 with lone surrogates allowed, or None when it is not."""
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None


def status_and_body(data: bytes) -> tuple[int, object]:
    """An HTTP answer as a client reads it: a first byte 0 is a 200, else the first two bytes are a status from
    100 to 599; the rest is the body parsed as JSON, None when it is none (as the gateway's clients read it)."""
    if len(data) < 2:
        return 200, None
    status = 200 if data[0] == 0 else 100 + int.from_bytes(data[:2], "big") % 500
    try:
        return status, json.loads(data[2:])
    except (ValueError, RecursionError):
        return status, None


def answer_bytes(status: int, body: str) -> bytes:
    """The input `status_and_body` reads as `status` and `body`."""
    return (b"\x00\x00" if status == 200 else (status - 100 + 500).to_bytes(2, "big")) + body.encode()


def run(test_one_input: Callable[[bytes], None], seeds: Callable[[], Iterable[bytes]]) -> None:
    """Fuzz `test_one_input`; an exception out of it is a crash (libFuzzer writes the input as crash-<sha1>). Given
    files instead of a corpus directory, libFuzzer runs each once: a crash replays so."""
    import atheris

    corpus = _corpus_dir(sys.argv)
    if corpus is not None and not os.path.isfile(corpus):  # a file is an input to replay (a crash-<sha1>)
        os.makedirs(corpus, exist_ok=True)
        if not os.listdir(corpus):
            for seed in seeds():
                with open(os.path.join(corpus, "seed-" + hashlib.sha1(seed).hexdigest()[:12]), "wb") as f:
                    f.write(seed)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
