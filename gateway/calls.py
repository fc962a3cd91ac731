"""Calls of the peer protocol (/peering/v1/*) on the entrance's raw path: admitted by `admission.admit_peer_call`
(after the registry it waits for, when it says so), the body a JSON object (`json_object`, which the join listener
applies too), handed to the control loop's handlers (bounded per peer by peercalls.py in front
of them) and answered as JSON; a Refusal is answered as every other."""

from __future__ import annotations

import json
from typing import Any

from contract import reasons
from contract.errors import Refusal
from gateway.accounting import ANSWERED
from gateway.admission import ClientState, admit_peer_call, caught_up
from gateway.headers import Fields, connection_tokens
from gateway.heads import Request
from gateway.protocol import ControlHandlers, PeerCall
from gateway.state import GatewayState


def json_object(data: bytes) -> dict:
    """A body that must be a JSON object, or the Refusal saying what it is instead."""
    try:
        body = json.loads(data)
    except ValueError:
        raise Refusal(400, reasons.MALFORMED_BODY, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refusal(400, reasons.MALFORMED_BODY, "the body is not a JSON object")
    return body


def asks_to_close(fields: Fields) -> bool:
    """Whether the client's Connection fields ask to close the connection after this request."""
    return any(name.lower() == b"connection" and b"close" in connection_tokens(value) for name, value in fields)


async def answer_peer_call(state: GatewayState, handlers: ControlHandlers, client: ClientState, fp: str | None,
                           method: str, target: str, decision: object, payload: bytes, close: bool) -> bytes:
    """The whole 200 answer to a peer call whose admission answered `decision` and whose body is `payload`
    (`close`: the connection ends after it), or the Refusal of its admission, its body or the control loop."""
    peer, op = await caught_up(state, decision, admit_peer_call, state, client, fp, method, target)  # type: ignore[misc]
    body = json_object(payload) if method == "POST" else None
    answer = json.dumps(await handlers.peer_call(PeerCall(peer=peer, op=op, body=body))).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(answer), b"Connection: close\r\n" if close else b"", answer)


class PeerCalls:
    """The peer calls of one entrance connection (serving.Serving, which this is a part of: it reads the heads
    and bodies, this admits, waits and answers, through the connection's own `_open_body`, `_wait`, `_refuse`,
    `failed`, `_end`)."""

    __slots__ = ()
    state: GatewayState
    handlers: ControlHandlers
    client: ClientState | None
    peering_fp: str | None
    close_after: bool
    call: "tuple[Request, object] | None"
    upload: Any
    waiting: bool
    open: bool
    io: Any

    def _peer_call(self, request: Request, client: ClientState) -> None:
        """A call of the peer protocol: admitted now, answered once its body (a JSON object) is complete."""
        try:
            decision = admit_peer_call(self.state, client, self.peering_fp, request.method.decode("latin-1"),
                                       request.target.decode("latin-1"))
        except Refusal as refusal:
            self.close_after = asks_to_close(request.fields)
            if not request.has_body or self._open_body(request, keep=False):
                self._refuse(refusal)
            return
        self.close_after = asks_to_close(request.fields)
        if request.has_body and not self._open_body(request, keep=True, call=True):
            return
        if self.upload is not None and self.upload.open:
            self.call = (request, decision)
        else:
            self._call(request, decision)

    def _call(self, request: Request, decision: object) -> None:
        """The call's body is complete: the control loop answers it (after the registry it waits for)."""
        self.call = None
        payload = self.upload.payload() if self.upload is not None else b""
        method, target = request.method.decode("latin-1"), request.target.decode("latin-1")
        self._wait(lambda: answer_peer_call(self.state, self.handlers, self.client, self.peering_fp,  # type: ignore
                                            method, target, decision, payload, self.close_after),
                   self._call_answered)

    def _call_answered(self, answer: bytes) -> None:
        self.waiting = False
        if self.open:
            self.io.write(answer)
        self._end(200, ANSWERED)
