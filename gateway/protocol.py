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
    #: The attempt's token ID made too many refused joins in the last minute (gateway/joinlimit.py): the control
    #: loop answers 429 TooManyAttempts unless the token verifies, which it checks first, in constant time and
    #: without telling an unknown token ID from a wrong secret. So only what is wrong is limited: the holder of
    #: the string always gets through, however many wrong guesses others made at its token ID.
    token_limited: bool = False


class ControlHandlers(Protocol):
    async def peer_call(self, call: PeerCall) -> dict: ...

    async def join(self, call: JoinCall) -> dict: ...
