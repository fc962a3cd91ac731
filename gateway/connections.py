"""The entrance's open connections by client certificate fingerprint: the per-peer limit, and the closing of a
peer's connections the moment it leaves the registry. A connection is tracked from the handshake on, on the raw
path and after a handover to the aiohttp path alike."""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from gateway.metrics import Metrics
from gateway.tls import peer_fingerprint


class PeerConnections:
    def __init__(self, max_per_peer: int, metrics: Metrics) -> None:
        self.max_per_peer = max_per_peer
        self._metrics = metrics
        self._by_fp: dict[str | None, set[Any]] = {}

    def admit(self, transport: asyncio.BaseTransport) -> str | None | bool:
        """After the handshake: the client certificate's fingerprint, or False over the peer's limit."""
        fp = peer_fingerprint(transport)
        conns = self._by_fp.get(fp)
        if conns is not None and len(conns) >= self.max_per_peer:
            self._metrics.handshake_failures.labels("entrance", "peer_connection_limit").inc()
            return False
        return fp

    def track(self, proto: Any, fp: str | None) -> None:
        """`proto` (an HTTP protocol of the entrance) serves the peer of `fp` until it calls `tls.connection_ended`."""
        proto.peering_fp = fp
        self._by_fp.setdefault(fp, set()).add(proto)
        proto.peering_on_lost = self.untrack

    def untrack(self, proto: Any) -> None:
        conns = self._by_fp.get(proto.peering_fp)
        if conns is not None:
            conns.discard(proto)
            if not conns:
                del self._by_fp[proto.peering_fp]

    def of(self, fp: str | None) -> frozenset:
        """The open connections of the peer of `fp`."""
        return frozenset(self._by_fp.get(fp, ()))

    def count(self) -> int:
        return sum(len(c) for c in self._by_fp.values())

    def close_gone(self, live: Iterable[str]) -> None:
        """Abort the connections of every fingerprint not in `live` (a new registry's)."""
        live = set(live)
        for fp in [fp for fp in self._by_fp if fp not in live]:
            for conn in list(self._by_fp.get(fp, ())):
                if conn.transport is not None:
                    self._metrics.revoked.inc()
                    conn.transport.abort()

    def abort_all(self) -> None:
        for conns in list(self._by_fp.values()):
            for conn in list(conns):
                if conn.transport is not None:
                    conn.transport.abort()
