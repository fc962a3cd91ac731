"""The data plane's HTTP/1.1 engine on asyncio: the protocol of every client connection of the entrance and the
egress is a `serving.Serving` (the connection's whole behaviour, sans-I/O) that carries out its own commands on its
transport and its loop, and takes what happens there as its events. Nothing is decided here: one object per
connection, so that the I/O costs a request no more than a call."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from gateway.listeners import Listener
from gateway.protocol import ControlHandlers
from gateway.serving import Serving
from gateway.state import GatewayState


class Connection(Serving, asyncio.Protocol):
    """One TLS client connection of `listener` (the entrance or the egress): a `Serving` whose `io` is itself."""

    __slots__ = ("loop", "transport", "timer", "head_timer", "task")

    def __init__(self, state: GatewayState, handlers: ControlHandlers, listener: Listener,
                 peering_fp: str | None) -> None:
        super().__init__(state, handlers, listener, peering_fp, self)
        self.loop = state.loop
        self.transport: Any = None
        self.timer: asyncio.TimerHandle | None = None
        self.head_timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task | None = None
        self.clock = state.loop.time  # `now`, without a call of ours

    # ----- events: what the transport reports ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.opened()

    data_received = Serving.received

    def pause_writing(self) -> None:
        self.writable(False)

    def resume_writing(self) -> None:
        self.writable(True)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.lost()

    # ----- commands (serving.ConnectionIo) ----------------------------------------------------------------
    def now(self) -> float:
        return self.loop.time()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    response_bytes = write  # an answer's bytes go as they came (answering.Answering.response_bytes, without a call)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def reading(self, on: bool) -> None:
        if self.transport is not None:
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def idle_at(self, when: float | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None if when is None else self.loop.call_at(when, self._idle_due)

    def _idle_due(self) -> None:
        self.timer = None
        self.idle_due()

    def head_deadline(self, delay: float | None) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
        self.head_timer = None if delay is None else self.loop.call_later(delay, self._head_due)

    def _head_due(self) -> None:
        self.head_timer = None
        self.head_due()

    def wait(self, start: Callable[[], Awaitable[Any]], then: Callable[[Any], None]) -> None:
        self.task = self.loop.create_task(self._run(start, then))

    async def _run(self, start: Callable[[], Awaitable[Any]], then: Callable[[Any], None]) -> None:
        try:
            result = await start()  # made here: a wait cancelled before it began leaves no coroutine unawaited
        except Exception as exc:
            self.task = None
            self.failed(exc)
            return
        self.task = None
        then(result)

    def cancel(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
