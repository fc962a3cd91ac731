"""gateway/joinlimit.py client_address and trusted_networks on any socket address, X-Forwarded-For, X-Real-IP and
list of trusted proxies. The trusted proxies are networks or a ValueError naming the entry; the client is an
address in canonical form (or the socket's own text, "-" for none), never an exception; a socket that is no
trusted proxy is the answer whatever the headers say; behind a trusted proxy, the hop it appends wins."""

from __future__ import annotations

import ipaddress

import atheris

with atheris.instrument_imports():
    from gateway.joinlimit import client_address, trusted_networks

from fuzz.common import run

DEFAULT = trusted_networks(["10.111.0.0/16", "fd00:10::/64"])
APPENDED = "203.0.113.9"


def _fields(data: bytes) -> list[str | None]:
    """Four lines: the trusted proxies (split on "|"), the socket's address, X-Forwarded-For, X-Real-IP; an empty
    line is none (the default proxies, no header). Text as aiohttp decodes header values."""
    lines = (data.split(b"\n", 3) + [b""] * 4)[:4]
    return [line.decode("utf-8", "surrogateescape") or None for line in lines]


def test_one_input(data: bytes) -> None:
    proxies, peer, forwarded_for, real_ip = _fields(data)
    trusted = DEFAULT
    if proxies is not None:
        entries = proxies.split("|")
        try:
            trusted = trusted_networks(entries)
        except ValueError as err:
            if "CIDR" not in str(err) or not any(repr(e) in str(err) for e in entries):
                raise AssertionError("a refusal of a trusted proxy that does not name it") from None
            trusted = DEFAULT
    answer = client_address(peer, forwarded_for, real_ip, trusted)
    try:
        canonical = str(ipaddress.ip_address(answer)) == answer
    except ValueError:
        canonical = False
    if not canonical and answer != (peer or "-"):
        raise AssertionError(f"client {answer!r} is neither an address nor the socket's text")
    try:
        socket_ip = ipaddress.ip_address(peer or "")
    except ValueError:
        return
    if not any(socket_ip in n for n in trusted):
        if answer != str(socket_ip):
            raise AssertionError(f"an untrusted socket {peer!r} answered as {answer!r}")
    elif not any(ipaddress.ip_address(APPENDED) in n for n in trusted):
        appended = f"{forwarded_for}, {APPENDED}" if forwarded_for else APPENDED
        if client_address(peer, appended, real_ip, trusted) != APPENDED:
            raise AssertionError("the hop a trusted proxy appended lost to what the client wrote")


def seeds():
    yield b"\n10.111.0.7\n198.51.100.1, 10.111.0.9\n198.51.100.2"
    yield b"10.0.0.0/8|fd00::/8\nfd00::1\n[2001:db8::1]:443\n"
    yield b"\n192.0.2.1\n10.111.0.1\n10.111.0.1"
    yield b"10.111.0.0/16\n10.111.0.7\n\n[fe80::1%eth0]:80"


if __name__ == "__main__":
    run(test_one_input, seeds)
