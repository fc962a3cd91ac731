"""The entrance's connections by client certificate (gateway/connections.py): a certificate of our CA that no live
peering holds (a revoked peer's, still valid) is answered 403 PeerUnknown and closed right after the handshake,
unless a ClusterPeer's exchange is under way (then it may be one in a moment, and its request waits for the
registry that has it); `peering_gateway_connections` counts every open TLS connection by listener."""

from __future__ import annotations

import asyncio
import json

from gateway.registry import Registry
from tests.gateway.support import ENTRANCE_HOST, client_ssl, make_token, registry_for

PODS = b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: " + ENTRANCE_HOST.encode() + b"\r\n"


def _metric(gw, attr: str, *labels: str) -> float:
    return sum(s.value for m in getattr(gw.metrics, attr).collect() for s in m.samples
               if all(label in s.labels.values() for label in labels) and not s.name.endswith("_created"))


async def _connect(gw, pki, cert: str):
    return await asyncio.open_connection("127.0.0.1", gw.entrance_port, ssl=client_ssl(pki, cert),
                                         server_hostname=ENTRANCE_HOST)


async def _close(writer) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


async def test_a_revoked_peer_s_idle_connections_are_answered_and_closed_right_after_the_handshake(gateway, pki,
                                                                                                 issuer_key):
    """Was: kept open until the idle timeout (330 s), up to the per-peer limit (2,000) per certificate."""
    gateway.publish(registry_for(pki, issuer_key, generation=2, peers=("peer2",)))  # "peer" was revoked
    refused_before = _metric(gateway, "handshake_failures", "entrance", "unknown_peer")
    conns = [await _connect(gateway, pki, "peer") for _ in range(20)]
    for reader, writer in conns:
        # Nothing sent: the answer comes anyway, and then the end of the connection.
        answer = await asyncio.wait_for(reader.read(), 5)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 ") and b"Connection: close" in head
        assert json.loads(body)["reason"] == "PeerUnknown"
        await _close(writer)
    assert _metric(gateway, "handshake_failures", "entrance", "unknown_peer") - refused_before == 20
    assert gateway.state.connections.count() == 0
    # A live peer's connection stays.
    reader, writer = await _connect(gateway, pki, "peer2")
    try:
        writer.write(PODS + b"Authorization: Bearer " + make_token(issuer_key).encode() + b"\r\n\r\n")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 ")
    finally:
        await _close(writer)


async def test_while_an_exchange_is_under_way_such_a_connection_waits_for_the_registry_that_has_it(gateway, pki,
                                                                                                 issuer_key):
    live = registry_for(pki, issuer_key, generation=3)
    joining = Registry(cluster_uuid=live.cluster_uuid, peers={}, by_fingerprint={}, capabilities=live.capabilities,
                       generation=2, pending=frozenset({"peer"}))
    gateway.publish(joining)
    reader, writer = await _connect(gateway, pki, "peer")
    try:
        writer.write(PODS + b"Authorization: Bearer " + make_token(issuer_key).encode() + b"\r\n\r\n")
        await writer.drain()
        gateway.publish(live)  # the registry that has the peering, a moment later
        assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 200 OK\r\n"
    finally:
        await _close(writer)


async def test_the_connections_gauge_counts_every_open_tls_connection_by_listener(gateway, pki):
    assert _metric(gateway, "connections", "entrance") == 0
    conns = [await _connect(gateway, pki, "peer") for _ in range(3)]
    async with asyncio.timeout(5):
        while _metric(gateway, "connections", "entrance") != 3:
            await asyncio.sleep(0.01)
    assert b'peering_gateway_connections{listener="entrance"} 3.0' in gateway.metrics_text()
    for _, writer in conns:
        await _close(writer)
    async with asyncio.timeout(5):
        while _metric(gateway, "connections", "entrance") != 0:
            await asyncio.sleep(0.01)
