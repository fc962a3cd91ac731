"""The typed requests the gateway hands to the control loop, and how the control loop refuses them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.registry import Peer

PEER_OPS = {"offer": "GET", "notify": "POST", "credentials": "POST", "certificate": "POST"}
"""The peer-to-peer operations under /peering/v1/ and the one method each accepts."""


@dataclass(frozen=True)
class PeerCall:
    """An authenticated call of a live peer on /peering/v1/<op>."""

    peer: Peer
    op: str  # "offer" | "notify" | "credentials" | "certificate"
    body: dict | None  # parsed JSON body (None for GET), already size-bounded


@dataclass(frozen=True)
class JoinCall:
    """POST /v1/join on the join listener."""

    body: dict
    remote: str  # client address, for rate limiting only


class ProtocolError(Exception):
    """A refusal the gateway answers as a Kubernetes Status with this code, reason and message."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


class ControlHandlers(Protocol):
    async def peer_call(self, call: PeerCall) -> dict: ...

    async def join(self, call: JoinCall) -> dict: ...
