"""The relay's answer to the request in progress on one connection (relay.RelayOwner), a part of serving.Serving:
the answer's head and bytes go to the client, an upstream that fails before answering is tried once more on a new
connection (unless a body already went on a fresh one, or it refused our certificate), one that fails during the
answer cuts the client too, and the API server's 403 to a grant that is new is tried again until the grant is in
force or the bound passed (grantlag.py). Sans-I/O: commands go to `io`, the relay and its pool."""

from __future__ import annotations

from typing import Any

from gateway.accounting import ANSWERED, INTERRUPTED
from gateway.authority import request_namespace
from gateway.grantlag import GRANTS_RETRY, pause
from gateway.framing import UNTIL_CLOSE, ResponseHead
from gateway.state import GatewayState
from gateway.upstream import CERTIFICATE_REFUSED, UpstreamError


class Answering:
    """The answers of one connection's requests (serving.Serving, which this is a part of)."""

    __slots__ = ()
    state: GatewayState
    io: Any
    clock: Any
    listener: Any
    client: Any
    relay: Any
    pool: Any
    upload: Any
    authority: Any
    open: bool
    busy: bool
    code: int
    watch: bool
    head: bytes
    path: bytes
    retried: bool
    close_after: bool
    paused: bool
    outcome: str | None
    settling: float
    settling_start: float
    start: float
    tries: int
    waiting: bool

    def response_started(self, head: ResponseHead) -> None:
        if head.code == 403 and self.listener.settles_grants and self._settling():
            self._try_again()  # the relay reads no more of this answer
            return
        self.code = head.code
        if self.upload is not None:
            self.upload.answered()
        if head.framing == UNTIL_CLOSE:
            self.close_after = True  # the body ends when the upstream closes: so does the client's connection
        self.head = b""  # kept only to retry on a fresh connection before any answer; a watch holds no copy
        if self.watch:
            self.state.metrics.watches.labels(self.listener.name, self.client.peer).inc()

    def _settling(self) -> bool:
        """Whether the API server's 403 may be the request's grants on their way (grantlag.py), and the
        request can go again as it went: its whole body kept."""
        if self.settling_start != self.start:  # this request's first 403
            self.settling_start, self.tries = self.start, 0
            authority = self.authority
            self.settling = self.state.fresh_grants.settling_until(
                authority.peer, authority.capabilities, request_namespace(self.path),  # type: ignore[union-attr]
                self.state.limits.registry_catch_up) or -1.0
        upload = self.upload
        return self.clock() < self.settling and (upload is None or not upload.active or not upload.open)

    def _try_again(self) -> None:
        relay, self.relay = self.relay, None
        relay.detach()  # type: ignore[union-attr]  # its answer unread: that connection is not reused
        if self.upload is not None:
            self.upload.detach()
        delay = min(GRANTS_RETRY * 2 ** self.tries, max(self.settling - self.clock(), 0.0))
        self.tries += 1
        self._wait(lambda: pause(delay), self._paused)

    def _paused(self, _: object = None) -> None:
        self.waiting = False
        self._go()

    def response_bytes(self, data: bytes) -> None:
        if self.open:
            self.io.write(data)

    def response_done(self) -> None:
        relay, self.relay = self.relay, None
        if self.upload is not None:
            self.upload.detach()
        if relay is not None and self.paused:
            relay.resume_reading()
        if self.watch and self.code:
            self.state.metrics.watches.labels(self.listener.name, self.client.peer).dec()
        self._end(self.code, ANSWERED)

    def upstream_failed(self, err: UpstreamError, got: bool) -> None:
        self.relay = None
        if self.upload is not None:
            self.upload.detach()
        if self.code:
            # The answer had started: the only honest signal left is to cut the client's connection.
            self.state.accounting.upstream_error(self.listener.name, "stream")
            if self.watch:
                self.state.metrics.watches.labels(self.listener.name, self.client.peer).dec()
            code = self.code
            self.busy = False
            self._finish(code, self.outcome or INTERRUPTED)
            if self.open:
                self.io.abort()
            return
        if not got and not self.retried and err.kind != CERTIFICATE_REFUSED:
            # A pooled connection the upstream had closed meanwhile: retry once on a new one (a refused client
            # certificate would be refused again).
            self.retried = True
            self._go()
            return
        self._upstream_refusal(err)

    def _upstream_refusal(self, err: UpstreamError) -> None:
        self.state.accounting.upstream_error(self.listener.name, err.kind)
        self._refuse(self.listener.upstream_refusal(err, self.client))  # type: ignore[arg-type]
