"""Which function answers each request the gateway hands to the control loop: the peer operations under
`/peering/v1/` and `POST /v1/join` (the gateway's `ControlHandlers`). The handlers register themselves here from
their reconciler factory; until one is registered, the gateway answers that request 503 NotReady."""

from __future__ import annotations

from typing import Awaitable, Callable

from contract import reasons
from contract.errors import Refusal
from contract.paths import PEER_OPS, PEER_PREFIX
from gateway.protocol import JoinCall, PeerCall

PeerOp = Callable[[PeerCall], Awaitable[dict]]
JoinHandler = Callable[[JoinCall], Awaitable[dict]]


class Handlers:
    """The `gateway.protocol.ControlHandlers` of the process: a registry of handlers by op."""

    def __init__(self) -> None:
        self._peer_ops: dict[str, PeerOp] = {}
        self._join: JoinHandler | None = None

    def add_peer_op(self, op: str, fn: PeerOp) -> None:
        if op not in PEER_OPS:
            raise ValueError(f"unknown peer operation {op!r}; known: {', '.join(sorted(PEER_OPS))}")
        if op in self._peer_ops:
            raise ValueError(f"a handler for peer operation {op!r} is already registered")
        self._peer_ops[op] = fn

    def set_join(self, fn: JoinHandler) -> None:
        if self._join is not None:
            raise ValueError("a join handler is already registered")
        self._join = fn

    async def peer_call(self, call: PeerCall) -> dict:
        fn = self._peer_ops.get(call.op)
        if fn is None:
            raise Refusal(503, reasons.NOT_READY, f"this cluster cannot answer {PEER_PREFIX}{call.op} yet; retry later")
        return await fn(call)

    async def join(self, call: JoinCall) -> dict:
        if self._join is None:
            raise Refusal(503, reasons.NOT_READY, "this cluster cannot accept joins yet; retry later")
        return await self._join(call)
