"""One worker process: a `DataPlane` serving the entrance and the egress on SO_REUSEPORT sockets the parent
bound, fed by the parent (workers.WorkerPool) over a pipe with every registry, certificate set and rotating
secret. Peer calls go to the parent's control handlers over its private Unix socket; metric scrapes and
exchange outcomes go back over the pipe."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from multiprocessing.connection import Connection

import aiohttp
from prometheus_client import generate_latest

from contract import reasons
from contract.errors import Refusal
from gateway.config import GatewayConfig
from gateway.dataplane import Certificates, DataPlane
from gateway.exchange import ExchangeFailures
from gateway.metrics import Metrics
from gateway.protocol import JoinCall, PeerCall
from gateway.registry import Registry

PEER_CALL_PATH = "/peer-call"


class _Pushed:
    """A config callable whose value the parent pushes (the SA token and Dex secret rotate in files)."""

    def __init__(self) -> None:
        self.value = ""

    def __call__(self) -> str:
        return self.value


class ForwardingHandlers:
    """The control loop's handlers as a worker sees them: peer calls go to the parent over its Unix socket."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._session: aiohttp.ClientSession | None = None

    async def peer_call(self, call: PeerCall) -> dict:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self._path))
        payload = {"peer": call.peer.name, "op": call.op, "body": call.body}
        async with self._session.post("http://parent" + PEER_CALL_PATH, json=payload) as resp:
            answer = await resp.json()
        if "error" in answer:
            raise Refusal(*answer["error"])
        return answer["ok"]

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
    handlers = ForwardingHandlers(control_path)
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
    loop.add_reader(conn.fileno(), on_message)
    conn.send(("ready", index))
    try:
        await done
    finally:
        loop.remove_reader(conn.fileno())
        await plane.stop()
        await handlers.close()
