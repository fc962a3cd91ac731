"""The join listener's rate limit on refused joins, keyed on what identifies an attacker (issue 14.4).

Behind the Ingress every connection comes from the Ingress controller, so the socket's address would lock out
every joiner after a few bad requests from anyone. The limit is kept per client address, as the trusted Ingress
reports it (`client_address`: X-Forwarded-For / X-Real-IP only on a connection from a configured trusted proxy,
otherwise the socket's address), and per token ID of the attempt: a client whose joins were refused too often
in a minute gets 429 until the oldest of those refusals is a minute old (guessing from one address). A token ID
guessed at too often from many addresses is limited too, but only for what is wrong: the listener hands such an
attempt on marked `JoinCall.token_limited`, and the control loop answers 429 unless its token verifies, checked
first in constant time from its cache (token IDs are no secret: viewers read status.invite.tokenID). Only
refusals count (a 4xx of the control loop), so a good connection string is never slowed by another's guessing.

Bounded: at most `max_keys` keys, least recently refused evicted first, one at a time, so a flood of new
addresses forgets the oldest attempts, never everyone at once.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from typing import Callable, Iterable

WINDOW = 60.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(proxies: Iterable[str]) -> tuple[Network, ...]:
    """The trusted proxies' addresses or CIDRs as networks; ValueError naming the one that is neither."""
    networks = []
    for proxy in proxies:
        try:
            networks.append(ipaddress.ip_network(proxy.strip(), strict=False))
        except ValueError:
            raise ValueError(f"trusted proxy {proxy!r} is not an IP address or CIDR; give the Ingress controller's "
                             "pod addresses, such as 10.111.0.0/16") from None
    return tuple(networks)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, trusted: tuple[Network, ...]) -> bool:
    return any(address in network for network in trusted)


def client_address(peer: str | None, forwarded_for: str | None, real_ip: str | None,
                   trusted: tuple[Network, ...]) -> str:
    """Who is asking: the socket's address `peer`, unless it is a trusted proxy; then the nearest address of
    X-Forwarded-For that is not a trusted proxy itself (the one the Ingress saw), or X-Real-IP. A header that
    names no address is not believed: the proxy's own address stands for the client."""
    socket_ip = _ip(peer) if peer else None
    if socket_ip is None:
        return peer or "-"
    if not trusted or not _trusted(socket_ip, trusted):
        return str(socket_ip)
    if forwarded_for:
        for hop in reversed(forwarded_for.split(",")):
            ip = _ip(hop)
            if ip is None:
                break
            if not _trusted(ip, trusted):
                return str(ip)
    if real_ip:
        ip = _ip(real_ip)
        if ip is not None:
            return str(ip)
    return str(socket_ip)


def token_id(body: object) -> str | None:
    """The token ID of a join body's `<tokenID>.<secret>` (bounded as tokens are), or None."""
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str):
        return None
    tid, sep, _ = token.partition(".")
    return tid if sep and 0 < len(tid) <= 16 else None


class JoinRateLimit:
    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._max = max_keys
        self._refused: OrderedDict[tuple[str, str], list[float]] = OrderedDict()

    def allows(self, address: str, tid: str | None = None) -> bool:
        """Whether a join from `address` (with the token ID `tid`, once known) may be tried now."""
        if len(self._recent(("address", address))) >= self.per_minute:
            return False
        return tid is None or len(self._recent(("token", tid))) < self.per_minute

    def refused(self, address: str, tid: str | None = None) -> None:
        """A join from `address` (for the token ID `tid`) was refused for what it sent."""
        now = self._clock()
        for key in (("address", address),) + ((("token", tid),) if tid is not None else ()):
            recent = self._recent(key)
            self._refused[key] = [*recent[-(self.per_minute - 1):], now] if self.per_minute > 1 else [now]
            self._refused.move_to_end(key)
            while len(self._refused) > self._max:
                self._refused.popitem(last=False)  # the least recently refused: one at a time

    def __len__(self) -> int:
        return len(self._refused)

    def _recent(self, key: tuple[str, str]) -> list[float]:
        since = self._clock() - WINDOW
        return [t for t in self._refused.get(key, ()) if t > since]
