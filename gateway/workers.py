"""The parent's side of the worker processes that serve the entrance and the egress, so that the gateway uses
every core.

The parent binds one SO_REUSEPORT socket per worker and listener (the kernel spreads connections across them),
spawns the workers (each runs worker.main, a data plane of its own), and keeps the join and ops listeners and the
control loop's handlers. It pushes every registry, certificate set and rotating secret to the workers over a
pipe; workers forward /peering/v1/ calls to the parent over a private Unix socket, and answer metric scrapes over
the pipe. A worker that dies is started again with the current state.

Token exchanges are the parent's too: a worker that finds a verified token's exchange in none of its own cache
asks the parent over the same socket, and the parent's one `ExchangeCache` (keyed by the token's hash, one Dex
call in flight per token, the per-peer bound) answers it, so a token is exchanged once per lifetime however many
workers see it. The token travels only over that socket (a 0700 directory) and is never logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import socket
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from contract import reasons
from contract.errors import Refusal
from gateway import worker as worker_process
from gateway.config import GatewayConfig
from gateway.exchange import ExchangeCache
from gateway.protocol import ControlHandlers, PeerCall
from gateway.registry import Registry
from gateway.tokens import unverified_expiry

log = logging.getLogger("gateway.workers")

SECRETS_PUSH_INTERVAL = 30.0


def reuseport_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one address; with port 0 the first picks it and the others join."""
    out: list[socket.socket] = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(4096)
            sock.setblocking(False)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


class _WorkerMetrics(Collector):
    """The latest metric scrapes of the parent ("main") and each worker, each sample labelled with its process."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def collect(self):
        merged: dict = {}
        for index, text in sorted(self.texts.items()):
            for family in text_string_to_metric_families(text):
                target = merged.get(family.name)
                if target is None:
                    target = merged[family.name] = family
                    samples = []
                else:
                    samples = target.samples
                for sample in family.samples:
                    samples.append(sample._replace(labels={**sample.labels, "worker": index}))
                target.samples = samples
        return list(merged.values())


@dataclasses.dataclass
class _Worker:
    index: int
    process: BaseProcess
    conn: Connection
    acked: int = 0


class WorkerPool:
    """The parent's side: spawns, feeds, scrapes, restarts and stops the workers."""

    def __init__(self, config: GatewayConfig, handlers: ControlHandlers, count: int) -> None:
        self.config = config
        self.handlers = handlers
        self._registry: Callable[[], Registry] = Registry.empty
        self._on_exchange: Callable[[str, tuple[str, str] | None], None] | None = None
        self._exchange: Callable[[], ExchangeCache | None] = lambda: None
        self.count = count
        self.metrics = _WorkerMetrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        self.sockets: dict[str, list[socket.socket]] = {}
        self._workers: dict[int, _Worker] = {}
        self._state: dict[str, tuple] = {}
        self._ctx = multiprocessing.get_context("spawn")
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._control: web.AppRunner | None = None
        self._tasks: set[asyncio.Task] = set()
        self._waiters: dict[int, asyncio.Future] = {}
        self._scrape_id = 0
        self._scrapes: dict[int, tuple[asyncio.Future, dict[int, str]]] = {}
        self._stopping = False
        self._seq = 0

    @property
    def entrance_port(self) -> int:
        return self.sockets["entrance"][0].getsockname()[1]

    @property
    def egress_port(self) -> int:
        return self.sockets["egress"][0].getsockname()[1]

    async def start(self, registry: Callable[[], Registry],
                    on_exchange: Callable[[str, tuple[str, str] | None], None],
                    exchange: Callable[[], ExchangeCache | None] = lambda: None) -> None:
        """Bind the sockets and start the workers; `registry` gives the current registry (for peer calls),
        `on_exchange` hears the workers' exchange outcomes, `exchange` gives the one exchange cache the workers'
        exchanges go through (None while it is not open yet)."""
        self._registry, self._on_exchange, self._exchange = registry, on_exchange, exchange
        cfg = self.config
        self.sockets = {"entrance": reuseport_sockets(cfg.entrance_host, cfg.entrance_port, self.count),
                        "egress": reuseport_sockets(cfg.egress_host, cfg.egress_port, self.count)}
        self._tmp = tempfile.TemporaryDirectory(prefix="peering-gateway-")
        os.chmod(self._tmp.name, 0o700)
        control_path = os.path.join(self._tmp.name, "control.sock")
        app = web.Application(client_max_size=cfg.limits.max_peer_call_bytes * 2 + 4096)
        app.router.add_post(worker_process.PEER_CALL_PATH, self._peer_call)
        app.router.add_post(worker_process.EXCHANGE_PATH, self._exchange_call)
        self._control = web.AppRunner(app, access_log=None)
        await self._control.setup()
        await web.UnixSite(self._control, control_path).start()
        self._control_path = control_path
        self._push_secrets()
        self._broadcast(("registry", self._registry()))
        await asyncio.gather(*(self._spawn(i) for i in range(self.count)))
        task = asyncio.get_running_loop().create_task(self._push_secrets_periodically())
        self._tasks.add(task)

    async def _spawn(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        parent, child = self._ctx.Pipe()
        sockets = {name: socks[index] for name, socks in self.sockets.items()}
        config = dataclasses.replace(self.config, api_token=None, dex_client_secret=None)
        process = self._ctx.Process(target=worker_process.main, name=f"peering-gateway-{index}", daemon=True,
                                    args=(index, config, sockets, child, self._control_path))
        process.start()
        child.close()
        worker = _Worker(index, process, parent)
        self._workers[index] = worker
        ready = loop.create_future()
        self._waiters[index] = ready
        loop.add_reader(parent.fileno(), self._on_message, worker)
        loop.add_reader(process.sentinel, self._on_exit, worker)
        for message in sorted(self._state.values(), key=lambda m: m[0]):
            parent.send(message)
        try:
            await asyncio.wait_for(ready, 60)
        except asyncio.TimeoutError:
            raise RuntimeError(f"gateway worker {index} did not start within 60 s; see its log") from None

    def _on_message(self, worker: _Worker) -> None:
        try:
            while worker.conn.poll():
                kind, *args = worker.conn.recv()
                if kind == "ack":
                    worker.acked = max(worker.acked, args[0])
                elif kind == "ready":
                    waiter = self._waiters.pop(worker.index, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                elif kind == "exchange":
                    if self._on_exchange is not None:
                        self._on_exchange(args[0], tuple(args[1]) if args[1] is not None else None)
                elif kind == "metrics":
                    scrape_id, index, text = args
                    entry = self._scrapes.get(scrape_id)
                    if entry is not None:
                        entry[1][index] = text
                        if len(entry[1]) == len(self._workers) and not entry[0].done():
                            entry[0].set_result(None)
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(worker.conn.fileno())

    def _on_exit(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.process.sentinel)
        try:
            loop.remove_reader(worker.conn.fileno())
        except (OSError, ValueError):
            pass
        worker.conn.close()
        if self._stopping or self._workers.get(worker.index) is not worker:
            return
        waiter = self._waiters.pop(worker.index, None)
        if waiter is not None and not waiter.done():
            # It never came up: starting it again would only fail the same way.
            waiter.set_exception(RuntimeError(f"gateway worker {worker.index} exited with "
                                              f"{worker.process.exitcode} before it was ready; see its log"))
            return
        log.error("gateway worker %d exited with %s; starting it again", worker.index, worker.process.exitcode)
        task = loop.create_task(self._spawn(worker.index))
        self._tasks.add(task)
        task.add_done_callback(self._restarted)

    def _restarted(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a gateway worker could not be started again: %s; /readyz reports it", task.exception())

    def _broadcast(self, message: tuple) -> None:
        self._seq += 1
        message = (self._seq, *message)
        self._state[message[1]] = message
        for worker in list(self._workers.values()):
            try:
                worker.conn.send(message)
            except OSError:
                pass  # a worker that died gets the state when it is started again

    def publish(self, registry: Registry) -> None:
        self._broadcast(("registry", registry))

    def reload_certificates(self, certs: dict[str, bytes]) -> None:
        self._broadcast(("certs", certs))

    def _push_secrets(self) -> None:
        self._broadcast(("secrets", self.config.api_token(), self.config.dex_client_secret()))

    async def _push_secrets_periodically(self) -> None:
        while True:
            await asyncio.sleep(SECRETS_PUSH_INTERVAL)
            self._push_secrets()

    def alive(self) -> bool:
        return len(self._workers) == self.count and all(w.process.is_alive() for w in self._workers.values())

    def synced(self) -> bool:
        """Every worker has applied the latest registry, certificates and secrets."""
        return all(w.acked >= self._seq for w in self._workers.values())

    async def scrape(self, own: str, timeout: float = 2.0) -> bytes:
        """The parent's metrics (`own`) and every worker's that answers in time, in one exposition."""
        self._scrape_id += 1
        fut = asyncio.get_running_loop().create_future()
        texts: dict[int, str] = {}
        self._scrapes[self._scrape_id] = (fut, texts)
        try:
            for worker in list(self._workers.values()):
                try:
                    worker.conn.send((0, "metrics", self._scrape_id))
                except OSError:
                    pass
            try:
                await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                pass
        finally:
            del self._scrapes[self._scrape_id]
        self.metrics.texts = {"main": own, **{str(i): t for i, t in sorted(texts.items())}}
        return generate_latest(self.registry)

    async def _peer_call(self, request: web.Request) -> web.Response:
        payload = await request.json()
        peer = self._registry().peers.get(payload.get("peer"))
        if peer is None:
            return web.json_response({"error": [403, reasons.PEER_UNKNOWN, "the peering was removed"]})
        try:
            answer = await self.handlers.peer_call(PeerCall(peer=peer, op=payload["op"], body=payload.get("body")))
        except Refusal as err:
            return web.json_response({"error": [err.code, err.reason, err.message, err.retry_after]})
        return web.Response(body=json.dumps({"ok": answer}).encode(), content_type="application/json")

    async def _exchange_call(self, request: web.Request) -> web.Response:
        """A worker's exchange of a token it verified: the parent's cache answers, or makes the one Dex call."""
        payload = await request.json()
        connector, token = payload.get("connector"), payload.get("token")
        cache = self._exchange()
        exp = unverified_expiry(token) if isinstance(token, str) else None
        if not isinstance(connector, str) or exp is None:
            return web.json_response({"error": [400, reasons.MALFORMED_REQUEST,
                                                "a worker's exchange names a connector and a token with an exp"]})
        if cache is None:
            return web.json_response({"error": [503, reasons.TOKEN_EXCHANGE_UNAVAILABLE,
                                                "the gateway is starting; retry"]})
        token_hash = hashlib.sha256(token.encode()).digest()
        try:
            exchanged = await cache.get(connector, token_hash, token, not_after=time.monotonic() + exp - time.time())
        except Refusal as err:
            return web.json_response({"error": [err.code, err.reason, err.message, err.retry_after]})
        return web.json_response({"ok": exchanged, "ttl": cache.lifetime(connector, token_hash)})

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in self._workers.values():
            try:
                worker.conn.send((0, "stop"))
            except OSError:
                pass
        loop = asyncio.get_running_loop()
        for worker in self._workers.values():
            await loop.run_in_executor(None, worker.process.join, 10)
            if worker.process.is_alive():
                worker.process.kill()
                await loop.run_in_executor(None, worker.process.join, 5)
            for fd in (worker.process.sentinel, worker.conn):
                try:
                    loop.remove_reader(fd if isinstance(fd, int) else fd.fileno())
                except (OSError, ValueError):
                    pass
            worker.conn.close()
        self._workers.clear()
        for socks in self.sockets.values():
            for sock in socks:
                sock.close()
        if self._control is not None:
            await self._control.cleanup()
        if self._tmp is not None:
            self._tmp.cleanup()
