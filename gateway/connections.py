"""The entrance's open connections by client certificate fingerprint: the per-peer limit, the closing of a
connection whose certificate no live peering holds right after its handshake (unless an exchange is under way, when
that certificate may be one in a moment: `Registry.certificate_may_come`), and the closing of a peer's connections the
moment it leaves the registry. A connection is its TLS stream (the transport of whichever protocol serves it), tracked
from the handshake to the end of its TCP connection, as the acceptor reports them (`tls.TLSAcceptor`'s `on_connect`
and `on_lost`); nothing is kept on the stream or its protocol."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable

from gateway.accounting import Accounting
from gateway.registry import Registry
from gateway.status import status_answer, unknown_certificate
from gateway.tls import peer_fingerprint


class PeerConnections:
    def __init__(self, max_per_peer: int, accounting: Accounting, registry: Callable[[], Registry],
                 catch_up: Callable[[], float]) -> None:
        self.max_per_peer = max_per_peer
        self._accounting = accounting
        self._metrics = accounting.metrics
        self._registry = registry
        self._catch_up = catch_up
        self._by_fp: dict[str | None, set[Any]] = {}
        self._fp_of: dict[Any, str | None] = {}

    def admit(self, transport: asyncio.BaseTransport) -> str | None | bool | bytes:
        """After the handshake: the client certificate's fingerprint; False over the peer's limit (the connection
        is aborted); or, when no live peering holds the certificate and none may in a moment (no exchange under
        way), the 403 PeerUnknown answer that the connection gets at once before it is closed: a revoked peer's
        certificate, still valid, holds no connection until its idle timeout, and its module still learns why."""
        fp = peer_fingerprint(transport)
        registry = self._registry()
        if (fp is None or fp not in registry.by_fingerprint) and \
                not registry.certificate_may_come(fp, self._catch_up()):
            self._metrics.handshake_failures.labels("entrance", "unknown_peer").inc()
            refusal = unknown_certificate()
            # Answered as a refusal like any other: an access log line and its count, before any request.
            self._accounting.refused_head("entrance", "-", refusal.code, refusal.reason)
            return status_answer(refusal.code, refusal.reason, refusal.message, close=True)
        conns = self._by_fp.get(fp)
        if conns is not None and len(conns) >= self.max_per_peer:
            self._metrics.handshake_failures.labels("entrance", "peer_connection_limit").inc()
            return False
        return fp

    def track(self, stream: asyncio.Transport, fp: str | None) -> None:
        """`stream` (an entrance connection, once admitted) serves the peer of `fp` until `untrack`."""
        self._fp_of[stream] = fp
        self._by_fp.setdefault(fp, set()).add(stream)

    def untrack(self, stream: asyncio.Transport) -> None:
        """`stream`'s TCP connection ended."""
        if stream not in self._fp_of:
            return
        fp = self._fp_of.pop(stream)
        conns = self._by_fp.get(fp)
        if conns is not None:
            conns.discard(stream)
            if not conns:
                del self._by_fp[fp]

    def of(self, fp: str | None) -> frozenset:
        """The open connections (TLS streams) of the peer of `fp`."""
        return frozenset(self._by_fp.get(fp, ()))

    def count(self) -> int:
        return sum(len(c) for c in self._by_fp.values())

    def close_gone(self, live: Iterable[str]) -> None:
        """Abort the connections of every fingerprint not in `live` (a new registry's)."""
        live = set(live)
        for fp in [fp for fp in self._by_fp if fp not in live]:
            for conn in list(self._by_fp.get(fp, ())):
                self._metrics.revoked.inc()
                conn.abort()

    def abort_all(self) -> None:
        for conns in list(self._by_fp.values()):
            for conn in list(conns):
                conn.abort()
