"""Open streams end when their authority ends (issue 14.3).

Every proxied request that has been admitted and not yet answered to its end (a watch, a long request) is held
here with the `Authority` that admitted it: the peer, the capabilities its token was granted, the consumer and the
time the token expires. Each registry the control loop publishes is checked against every one of them with the
rule admission applies (`still_admits`); those that no longer pass are closed, and so is every one whose token
expires, at its expiry. Revocation (the peer gone from the registry) is the same rule. Each process (worker) holds
its own, fed by its own `GatewayState.publish`.

A project unpairing is seen on the entrance through the ClusterPeer's status.grants (capability, namespaces): a
request in a namespace they listed for its capability is closed once they no longer do. The egress has no such
list of the peer's (its own status.grants describe the other direction): there the peer's entrance closes it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Hashable

from gateway.consumers import consumer_capabilities
from gateway.registry import Registry


class Authority:
    """What admitted a request: the peering `peer` (a ClusterPeer's name), the `capabilities` granted to the
    consumer `account` (namespace, ServiceAccount) by its token, and `expires`, the wall-clock time after which the
    token no longer passes."""

    __slots__ = ("peer", "capabilities", "account", "expires")

    def __init__(self, peer: str, capabilities: frozenset[str], account: tuple[str, str] | None,
                 expires: float) -> None:
        self.peer = peer
        self.capabilities = capabilities
        self.account = account
        self.expires = expires

    def __repr__(self) -> str:
        return f"Authority({self.peer!r}, {sorted(self.capabilities)!r}, {self.account!r}, {self.expires!r})"


def still_admits(registry: Registry, authority: Authority) -> bool:
    """Whether `registry` still grants what `authority` was admitted with: the peering is live, and one of its
    capabilities is effective for it, Accepted here and lists the consumer (the rule of tokens.py and
    tokenreview.py, over the capabilities the token was granted)."""
    peer = registry.peers.get(authority.peer)
    if peer is None:
        return False
    return bool(consumer_capabilities(registry, authority.capabilities & peer.effective, authority.account))


def granted_in(registry: Registry, authority: Authority, namespace: str) -> bool:
    """Whether the peer's status.grants give one of the authority's capabilities access in `namespace`; True when
    the status lists no grants at all (nothing to go by)."""
    peer = registry.peers.get(authority.peer)
    if peer is None:
        return False
    grants = peer.grants
    return grants is None or any((c, namespace) in grants for c in authority.capabilities)


def request_namespace(target: bytes) -> str | None:
    """The namespace of a request for a namespaced resource (/api/v1/namespaces/<ns>/<resource>..., or under
    /apis/<group>/<version>/), None for anything else (the namespace object itself included)."""
    parts = target.partition(b"?")[0].split(b"/")
    if len(parts) > 5 and parts[1] == b"api" and parts[3] == b"namespaces" and parts[5]:
        return parts[4].decode("latin-1") or None
    if len(parts) > 6 and parts[1] == b"apis" and parts[4] == b"namespaces" and parts[6]:
        return parts[5].decode("latin-1") or None
    return None


class OpenStreams:
    """The open proxied requests of one process, each with its Authority and how to close it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, clock: Callable[[], float] = time.time,
                 on_close: Callable[[], None] | None = None) -> None:
        self._loop = loop
        self._clock = clock
        self._on_close = on_close
        self._open: dict[Hashable, tuple[Authority, Callable[[], None], str | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._due = float("inf")
        self._last_authority: Authority | None = None
        self._last_registry: Registry | None = None

    def __len__(self) -> int:
        return len(self._open)

    def add(self, key: Hashable, authority: Authority, close: Callable[[], None], registry: Registry,
            namespace: str | None = None) -> bool:
        """Hold the request `key` until `discard(key)`; `close()` ends it (aborts its client connection). False
        (and nothing held) when `registry`, the one in force now, no longer admits `authority`: a request admitted
        before a registry that came while it waited (for Dex, a review, a connection) goes no further. A request
        in `namespace` that the peer's status.grants list for one of its capabilities is closed too once they no
        longer do (a project unpaired; the callers give the namespace of watches, the streams that outlive a
        change); one in a namespace they do not list (yet) is left to the API server."""
        if authority is not self._last_authority or registry is not self._last_registry:
            if authority.expires <= self._clock() or not still_admits(registry, authority):
                return False
            self._last_authority, self._last_registry = authority, registry
        if namespace is not None and not granted_in(registry, authority, namespace):
            namespace = None
        self._open[key] = (authority, close, namespace)
        if authority.expires < self._due:
            self._arm(authority.expires)
        return True

    def discard(self, key: Hashable) -> None:
        self._open.pop(key, None)

    def recheck(self, registry: Registry) -> int:
        """Close every held request that `registry` no longer admits; how many were closed."""
        verdicts: dict[int, bool] = {}  # requests of one token share one Authority: decided once
        gone = []
        for key, (authority, _, namespace) in self._open.items():
            ok = verdicts.get(id(authority))
            if ok is None:
                ok = verdicts[id(authority)] = still_admits(registry, authority)
            if not ok or (namespace is not None and not granted_in(registry, authority, namespace)):
                gone.append(key)
        return self._close(gone)

    def close_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._open.clear()

    def _close(self, keys: list) -> int:
        for key in keys:
            entry = self._open.pop(key, None)
            if entry is not None:
                if self._on_close is not None:
                    self._on_close()
                entry[1]()
        return len(keys)

    def _arm(self, due: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._due = due
        self._timer = self._loop.call_at(self._loop.time() + max(0.0, due - self._clock()), self._expire)

    def _expire(self) -> None:
        self._timer, self._due = None, float("inf")
        now = self._clock()
        self._close([key for key, (authority, *_) in self._open.items() if authority.expires <= now])
        due = min((authority.expires for authority, *_ in self._open.values()), default=float("inf"))
        if due != float("inf"):
            self._arm(due)
