"""One worker process: a `DataPlane` serving the entrance and the egress on SO_REUSEPORT sockets the parent
bound, fed by the parent (workers.WorkerPool) over a pipe with every registry, certificate set and rotating
secret. Peer calls and token exchanges go to the parent over its private Unix socket (the parent holds the one
exchange cache, so that a token is exchanged once however many workers see it; each worker keeps what the parent
answered in a cache of its own until the parent's entry ends); metric scrapes go back over the pipe."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
from multiprocessing.connection import Connection

import aiohttp
from prometheus_client import generate_latest

from contract import reasons
from contract.errors import Refusal
from gateway.config import GatewayConfig
from gateway.dataplane import Certificates, DataPlane
from gateway.exchange import ExchangeCache, ExchangeFailures
from gateway.metrics import Metrics
from gateway.protocol import JoinCall, PeerCall
from gateway.registry import Registry

PEER_CALL_PATH = "/peer-call"
EXCHANGE_PATH = "/exchange"


class _Pushed:
    """A config callable whose value the parent pushes (the SA token and Dex secret rotate in files)."""

    def __init__(self) -> None:
        self.value = ""

    def __call__(self) -> str:
        return self.value


def _refusal(error: list) -> Refusal:
    """The Refusal the parent answered: [code, reason, message] and, where it has one, its Retry-After."""
    code, reason, message, *rest = error
    return Refusal(code, reason, message, retry_after=rest[0] if rest else None)


class ForwardingHandlers:
    """The control loop's handlers as a worker sees them: peer calls go to the parent over its Unix socket; so do
    token exchanges (`exchange`, the call of the worker's own `ExchangeCache`)."""

    def __init__(self, path: str, exchange_timeout: float = 10.0) -> None:
        self._path = path
        self._session: aiohttp.ClientSession | None = None
        # The parent's Dex call has its own timeout; this one only bounds a parent that does not answer.
        self._exchange_timeout = aiohttp.ClientTimeout(total=exchange_timeout + 5)

    def _parent(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self._path))
        return self._session

    async def peer_call(self, call: PeerCall) -> dict:
        payload = {"peer": call.peer.name, "op": call.op, "body": call.body}
        async with self._parent().post("http://parent" + PEER_CALL_PATH, json=payload) as resp:
            answer = await resp.json()
        if "error" in answer:
            raise _refusal(answer["error"])
        return answer["ok"]

    async def exchange(self, connector_id: str, token: str) -> tuple[str, float]:
        """The parent's exchange of a token this worker verified: (exchanged token, seconds the parent keeps it)."""
        try:
            async with self._parent().post("http://parent" + EXCHANGE_PATH, timeout=self._exchange_timeout,
                                           data=json.dumps({"connector": connector_id, "token": token}),
                                           headers={"Content-Type": "application/json"}) as resp:
                answer = await resp.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise Refusal(503, reasons.TOKEN_EXCHANGE_UNAVAILABLE, "the gateway's main process did not answer the "
                          f"token exchange ({type(exc).__name__}); it is retried on the next request") from None
        if "error" in answer:
            raise _refusal(answer["error"])
        return answer["ok"], float(answer["ttl"])

    async def join(self, call: JoinCall) -> dict:  # pragma: no cover - workers do not serve the join listener
        raise Refusal(404, reasons.NOT_FOUND, "join is served by the parent process")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def main(index: int, config: GatewayConfig, sockets: dict[str, socket.socket], conn: Connection,
         control_path: str) -> None:
    """The worker process's entry point (a `multiprocessing` target)."""
    import uvloop
    logging.basicConfig(level=logging.WARNING)
    uvloop.run(serve(index, config, sockets, conn, control_path))


async def serve(index: int, config: GatewayConfig, sockets: dict[str, socket.socket], conn: Connection,
                control_path: str) -> None:
    token, secret = _Pushed(), _Pushed()
    config = dataclasses.replace(config, api_token=token, dex_client_secret=secret, workers=1)
    handlers = ForwardingHandlers(control_path, config.limits.exchange_timeout)
    metrics = Metrics()
    failures = ExchangeFailures()

    def on_exchange(connector: str, failure: tuple[str, str] | None) -> None:
        if failures.record(connector, failure):
            conn.send(("exchange", connector, failure))

    plane = DataPlane(config, handlers, metrics, listeners=("entrance", "egress"), on_exchange=on_exchange)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def on_message() -> None:
        try:
            while conn.poll():
                seq, kind, *args = conn.recv()
                if kind == "registry":
                    plane.publish(args[0])
                elif kind == "certs":
                    plane.reload_certificates(Certificates.from_pem(**args[0]))
                elif kind == "secrets":
                    token.value, secret.value = args
                elif kind == "metrics":
                    conn.send(("metrics", args[0], index, generate_latest(metrics.registry).decode()))
                elif kind == "stop" and not done.done():
                    done.set_result(None)
                conn.send(("ack", seq))
        except (EOFError, OSError):
            if not done.done():
                done.set_result(None)

    await plane.start(Registry.empty(), sockets=sockets)
    assert plane.state is not None
    # What the parent answered, kept as long as the parent keeps it (its entry already ends before the exchanged
    # token does, and never after the subject token's exp); misses of one token share one call to the parent.
    own, plane.state.exchange = plane.state.exchange, ExchangeCache(handlers.exchange, margin=0)
    await own.close()
    loop.add_reader(conn.fileno(), on_message)
    conn.send(("ready", index))
    try:
        await done
    finally:
        loop.remove_reader(conn.fileno())
        await plane.stop()
        await handlers.close()
