"""The typed requests the gateway hands to the control loop; the control loop refuses them with
`contract.errors.Refusal`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.registry import Peer

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


class ControlHandlers(Protocol):
    async def peer_call(self, call: PeerCall) -> dict: ...

    async def join(self, call: JoinCall) -> dict: ...
