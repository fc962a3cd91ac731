"""The bound on each peer's calls of the peer protocol (/peering/v1/*): a token bucket per ClusterPeer
(`ratelimit.TokenBuckets`, `Limits.peer_calls_per_second` and `peer_call_burst`) in front of the control loop's
handlers. Every peer call of the process passes here: the parent's own entrance and, through the parent's Unix
socket, every worker's (workers.py), so the bound is one per peer whatever the number of workers. A call beyond it
is refused with 429 PeerCallsRateLimited and a Retry-After before the control loop reads anything for it; the
module shares its API budget with its own control loop, and one peer may not spend it for every peering.
"""

from __future__ import annotations

import time
from typing import Callable

from contract import reasons
from contract.errors import Refusal
from gateway.protocol import ControlHandlers, JoinCall, PeerCall
from gateway.ratelimit import TokenBuckets, retry_after_seconds


class PeerCallBound:
    """`ControlHandlers` with each peer's peer protocol calls bounded; joins pass as they are (their own limit is
    joinlimit.py's)."""

    def __init__(self, handlers: ControlHandlers, rate: float, burst: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.handlers = handlers
        self.buckets = TokenBuckets(rate, burst, clock=clock, unit="peer call")

    async def peer_call(self, call: PeerCall) -> dict:
        wait = self.buckets.take(call.peer.name)
        if wait:
            seconds = retry_after_seconds(wait)
            raise Refusal(429, reasons.PEER_CALLS_RATE_LIMITED,
                          f"this peer calls the peering protocol more often than this gateway answers one peer "
                          f"({self.buckets.rate:g} calls a second, bursts of {self.buckets.burst:g}); retry after "
                          f"{seconds} s", retry_after=seconds)
        return await self.handlers.peer_call(call)

    async def join(self, call: JoinCall) -> dict:
        return await self.handlers.join(call)
