"""The Python work of one request on the entrance's raw path, without sockets or TLS:

    python -m bench.gateway_micro [requests]

A real Connection (gateway/engine.py) and Relay (with the real admission chain, framing and accounting of a GatewayState) run
against in-memory transports, with the peer, the verified token and the exchanged token already cached (the keep-alive case of bench/gateway_bench.py). It prints the best of five
rounds in microseconds of this process's CPU time per request: what the gateway's own code costs, apart from the kernel and TLS work that
gateway_bench.py measures in full. Deterministic enough to compare two versions of the hot path on a busy
machine, where the full benchmark's numbers move by more than such a change.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from types import SimpleNamespace

from gateway.config import GatewayConfig
from gateway.engine import Connection
from gateway.listeners import Entrance
from gateway.metrics import Metrics
from gateway.registry import Registry
from gateway.relay import Relay
from gateway.state import GatewayState
from gateway.tokens import VerifiedToken

TOKEN = "eyJ" + "a" * 900  # the size of a projected ServiceAccount token
EXCHANGED = "exchanged-" + "b" * 800
BODY = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}'
REQUEST = (b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: peering-gateway.x.lab\r\nAuthorization: Bearer "
           + TOKEN.encode() + b"\r\nUser-Agent: kubectl/v1.30\r\nAccept: application/json, */*\r\n"
           b"Connection: keep-alive\r\n\r\n")
RESPONSE = (b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 30 Nov 2026 02:00:00 GMT\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n" % len(BODY)
            ) + BODY


class MemoryTransport:
    """Collects what is written; never closes, never pushes back."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default=None):
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def measure(requests: int, rounds: int = 5) -> float:
    config = GatewayConfig(public_domain_template="%s.x.lab", api_server="https://api.x.lab", api_ca_pem=None,
                           dex_url="https://dex.x.lab", dex_ca_pem=None, dex_client_id="gateway",
                           dex_client_secret=lambda: "unused", access_log=False)
    state = GatewayState.open(config, Metrics(), Registry.empty())
    real_exchange = state.exchange
    peer = SimpleNamespace(name="peer", connector_id="peering-peer", effective=frozenset({"read"}),
                           grants=frozenset({("read", "default")}),
                           validity={"fp": (time.time() - 60, time.time() + 86400)})
    read = SimpleNamespace(accepted=True, consumers=frozenset({("mod", "controller")}))
    state.registry = SimpleNamespace(by_fingerprint={"fp": peer}, peers={"peer": peer},  # type: ignore[assignment]
                                     capabilities={"read": read})
    token_hash = hashlib.sha256(TOKEN.encode()).digest()
    state.tokens._by_hash[token_hash] = VerifiedToken(
        peer="peer", subject="system:serviceaccount:mod:controller", capabilities=frozenset({"read"}),
        expires=time.time() + 3600)
    state.exchange = SimpleNamespace(cached=lambda connector, key: EXCHANGED)  # type: ignore[assignment]
    state.api_prefix = b""
    pool = SimpleNamespace(loop=state.loop, idle_timeout=330.0, idle=[], max_idle=64, authority="api.x.lab",
                           all=set())
    pool.take = lambda: pool.idle.pop() if pool.idle else None
    pool.park = pool.idle.append
    relay = Relay(pool)  # type: ignore[arg-type]
    relay.connection_made(MemoryTransport())
    pool.idle.append(relay)
    real_relay_pool, state.relay_pool = state.relay_pool, pool  # type: ignore[assignment]
    client = MemoryTransport()
    proto = Connection(state, None, Entrance(), "fp")  # type: ignore[arg-type,return-value]
    proto.connection_made(client)
    best = float("inf")
    try:
        for _ in range(rounds):
            # CPU time of this process: on a shared machine, time spent waiting for a core is not the gateway's.
            start = time.process_time()
            for _ in range(requests):
                proto.data_received(REQUEST)
                relay.data_received(RESPONSE)
            best = min(best, (time.process_time() - start) / requests * 1e6)
            upstream = relay.transport.written
            if (len(client.written) != requests or not client.written[-1].endswith(BODY) or pool.idle != [relay]
                    or not upstream[-1].startswith(b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\n")):
                raise SystemExit("the raw path did not relay every request; the measurement is void")
            client.written.clear()
            relay.transport.written.clear()
    finally:
        proto.connection_lost(None)
        state.exchange, state.relay_pool = real_exchange, real_relay_pool
        await state.close()
    return best


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    print(f"raw path, Python work per keep-alive request: {asyncio.run(measure(requests)):.2f} us")


if __name__ == "__main__":
    main()
