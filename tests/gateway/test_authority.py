"""authority.py without sockets: the rule that re-decides an open request against a new registry, and the table of
open requests that closes those it no longer admits and those whose token expires."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import replace

from gateway.authority import Authority, OpenStreams, still_admits
from tests.gateway.support import registry_for
from tests.gateway.test_withdrawal import withdrawn

CONSUMER = ("mod", "controller")


def test_the_rule_is_admission_s_over_the_granted_capabilities(pki, issuer_key):
    reg = registry_for(pki, issuer_key)
    ok = Authority("peer", frozenset({"read-pods"}), CONSUMER, time.time() + 60)
    assert still_admits(reg, ok)
    assert still_admits(withdrawn(reg, "unrelated"), ok)
    for kind in ("capability-closed", "capability-not-accepted", "consumer-removed"):
        assert not still_admits(withdrawn(reg, kind), ok), kind
    assert not still_admits(registry_for(pki, issuer_key, peers=("peer2",)), ok)  # revoked
    assert not still_admits(reg, Authority("peer", frozenset({"write-pods"}), CONSUMER, time.time() + 60))
    assert not still_admits(reg, Authority("peer", frozenset({"read-pods"}), ("mod", "other"), time.time() + 60))
    assert not still_admits(reg, Authority("peer", frozenset({"read-pods"}), None, time.time() + 60))


async def test_a_new_registry_closes_only_what_it_no_longer_admits(pki, issuer_key):
    reg = registry_for(pki, issuer_key)
    streams = OpenStreams(asyncio.get_running_loop())
    closed: list[str] = []
    reader = Authority("peer", frozenset({"read-pods"}), CONSUMER, time.time() + 60)
    other = Authority("peer", frozenset({"read-pods"}), ("mod", "other"), time.time() + 60)
    assert streams.add("a", reader, lambda: closed.append("a"), reg)
    assert streams.add("b", reader, lambda: closed.append("b"), reg)
    # A request admitted on an older registry that the one in force no longer admits goes no further.
    assert not streams.add("c", other, lambda: closed.append("c"), reg)
    assert len(streams) == 2
    assert streams.recheck(withdrawn(reg, "unrelated")) == 0 and closed == []
    streams.discard("b")
    assert streams.recheck(withdrawn(reg, "consumer-removed")) == 1 and closed == ["a"]
    assert len(streams) == 0
    assert not streams.add("d", reader, lambda: None, withdrawn(reg, "consumer-removed"))
    streams.close_all()


async def test_a_token_s_expiry_closes_its_requests_at_that_time_and_no_other(pki, issuer_key):
    reg = registry_for(pki, issuer_key)
    streams = OpenStreams(asyncio.get_running_loop())
    done = {name: asyncio.Event() for name in ("soon", "later", "gone")}
    now = time.time()
    soon = Authority("peer", frozenset({"read-pods"}), CONSUMER, now + 0.3)
    later = Authority("peer", frozenset({"read-pods"}), CONSUMER, now + 0.6)
    assert streams.add("later", later, done["later"].set, reg)
    assert streams.add("soon", soon, done["soon"].set, reg)
    assert streams.add("gone", soon, done["gone"].set, reg)
    streams.discard("gone")  # answered before its token expired: nothing to close
    async with asyncio.timeout(2):
        await done["soon"].wait()
    assert time.time() >= now + 0.3 and not done["later"].is_set()
    async with asyncio.timeout(2):
        await done["later"].wait()
    assert time.time() >= now + 0.6 and not done["gone"].is_set() and len(streams) == 0
    # An expired token is never held.
    expired = Authority("peer", soon.capabilities, CONSUMER, time.time() - 1)
    assert not streams.add("late", expired, lambda: None, reg)
    streams.close_all()


def test_the_namespace_of_a_request():
    from gateway.authority import request_namespace
    assert request_namespace(b"/api/v1/namespaces/shop/configmaps?watch=true") == "shop"
    assert request_namespace(b"/apis/apps/v1/namespaces/shop/deployments/web") == "shop"
    assert request_namespace(b"/api/v1/namespaces/shop") is None  # the namespace object: cluster-scoped
    assert request_namespace(b"/api/v1/configmaps") is None and request_namespace(b"/version") is None
    assert request_namespace(b"/apis/apps/v1/namespaces/shop") is None


async def test_a_namespace_leaving_the_grants_closes_only_its_requests(pki, issuer_key):
    reg = registry_for(pki, issuer_key)
    peer = reg.peers["peer"]

    def granted(*namespaces: str):
        p = replace(peer, grants=frozenset(("read-pods", ns) for ns in namespaces))
        return replace(reg, peers={"peer": p}, by_fingerprint={fp: p for fp in p.fingerprints})

    streams = OpenStreams(asyncio.get_running_loop())
    closed: list[str] = []
    reader = Authority("peer", frozenset({"read-pods"}), CONSUMER, time.time() + 60)
    first = granted("a", "b")
    assert streams.add("in-a", reader, lambda: closed.append("in-a"), first, "a")
    assert streams.add("in-b", reader, lambda: closed.append("in-b"), first, "b")
    # Not granted (yet) when it came: the API server decides; the gateway does not close it for the grants.
    assert streams.add("in-c", reader, lambda: closed.append("in-c"), first, "c")
    assert streams.add("cluster", reader, lambda: closed.append("cluster"), first)
    assert streams.recheck(granted("b")) == 1 and closed == ["in-a"]
    assert streams.recheck(replace(granted("b"), peers={"peer": replace(peer, grants=None)})) == 0
    streams.close_all()


def test_the_registry_reads_status_grants(pki, issuer_key):
    from gateway.registry import peer_from_objects
    reg = registry_for(pki, issuer_key)
    assert reg.peers["peer"].grants is None  # no status.grants yet: nothing to go by
    secret = {"data": {"issued.crt": base64.b64encode(pki["peer"].cert_chain_pems[0].bytes()).decode()}}
    cp = {"metadata": {"name": "p"}, "status": {"grants": [
        {"capability": "read-pods", "namespaces": ["shop", "web", 7]}, {"capability": "nodes", "namespaces": []},
        {"namespaces": ["x"]}, "junk"]}}
    assert peer_from_objects(cp, secret).grants == {("read-pods", "shop"), ("read-pods", "web")}
