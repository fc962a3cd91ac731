"""Registry snapshots are a pure function of API objects: liveness, fingerprints, capabilities, partial objects."""

from __future__ import annotations

import base64
import hashlib

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gateway.registry import Registry, cert_fingerprints
from gateway.resolve import parse_resolve_args


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def make_objects(name: str, cert_pem: bytes, *, deleting: bool = False, uuid: str = "uuid-b"):
    cp = {"metadata": {"name": name}, "status": {
        "effectiveCapabilities": ["read-pods"],
        "peer": {"clusterUUID": uuid, "issuer": {"url": "https://issuer.b", "jwks": '{"keys": []}'}}}}
    if deleting:
        cp["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    secret = {"metadata": {"name": f"peer-{name}"}, "data": {
        "issued.crt": b64(cert_pem), "peer-entrance": b64(b"peering-gateway.b.lab:443"),
        "peer-ca.crt": b64(b"CA"), "client.crt": b64(b"CRT"), "client.key": b64(b"KEY"), "peer-uuid": b64(b"other")}}
    return cp, secret


@pytest.fixture(scope="module")
def certs():
    ca = trustme.CA()
    return [ca.issue_cert(f"peer{i}.lab").cert_chain_pems[0].bytes() for i in range(3)]


def fp(pem: bytes) -> str:
    return hashlib.sha256(x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)).hexdigest()


def test_live_peer_is_indexed_by_fingerprint_with_all_fields(certs):
    cp, secret = make_objects("b", certs[0])
    cap = {"metadata": {"name": "read-pods"}, "spec": {"version": "v1", "consumers": [
        {"kind": "ServiceAccount", "namespace": "ns", "name": "sa"}, {"namespace": "ns2", "name": "sa2"}]},
        "status": {"conditions": [{"type": "Accepted", "status": "True"}]}}
    reg = Registry.from_objects(cluster_uuid="uuid-a", clusterpeers=[cp], peer_secrets=[secret],
                                capabilities=[cap], generation=7)
    peer = reg.by_fingerprint[fp(certs[0])]
    assert peer is reg.peers["b"]
    assert (peer.uuid, peer.issuer_url, peer.jwks_json) == ("uuid-b", "https://issuer.b", '{"keys": []}')
    assert peer.effective == frozenset({"read-pods"}) and peer.connector_id == "peering-b"
    assert peer.entrance == "peering-gateway.b.lab:443"
    assert (peer.peer_ca_pem, peer.client_cert_pem, peer.client_key_pem) == (b"CA", b"CRT", b"KEY")
    assert reg.capabilities["read-pods"].consumers == frozenset({("ns", "sa"), ("ns2", "sa2")})
    assert reg.capabilities["read-pods"].accepted and reg.generation == 7 and reg.loaded


def test_peer_without_issued_cert_or_being_deleted_is_not_live(certs):
    cp1, s1 = make_objects("deleting", certs[0], deleting=True)
    cp2, s2 = make_objects("nocert", certs[1])
    del s2["data"]["issued.crt"]
    cp3, _ = make_objects("nosecret", certs[2])
    reg = Registry.from_objects(cluster_uuid="a", clusterpeers=[cp1, cp2, cp3], peer_secrets=[s1, s2],
                                capabilities=[], generation=1)
    assert dict(reg.peers) == {} and dict(reg.by_fingerprint) == {}


def test_partial_and_garbage_objects_are_tolerated(certs):
    cp, secret = make_objects("b", certs[0])
    del cp["status"]
    secret["data"]["peer-entrance"] = "***not base64***"
    reg = Registry.from_objects(cluster_uuid="a", clusterpeers=[cp, {}, {"metadata": {}}],
                                peer_secrets=[secret, {"data": None}], capabilities=[{}, {"metadata": {"name": "x"}}],
                                generation=2)
    peer = reg.peers["b"]
    assert peer.uuid == "other" and peer.issuer_url is None and peer.effective == frozenset() and peer.entrance is None
    assert reg.capabilities["x"].accepted is False and reg.capabilities["x"].consumers == frozenset()


def test_fingerprint_claimed_by_two_peers_maps_to_neither(certs):
    cp1, s1 = make_objects("b", certs[0])
    cp2, s2 = make_objects("c", certs[0])
    cp3, s3 = make_objects("d", certs[0])
    reg = Registry.from_objects(cluster_uuid="a", clusterpeers=[cp1, cp2, cp3], peer_secrets=[s1, s2, s3],
                                capabilities=[], generation=1)
    assert fp(certs[0]) not in reg.by_fingerprint and len(reg.peers) == 3


def test_bundle_fingerprints_every_cert_and_garbage_gives_none(certs):
    assert cert_fingerprints(certs[0] + certs[1]) == [fp(certs[0]), fp(certs[1])]
    assert cert_fingerprints(b"garbage") == []


def test_empty_registry_is_not_loaded():
    reg = Registry.empty()
    assert not reg.loaded and dict(reg.peers) == {}


def test_resolve_flags_parse_and_refuse_malformed():
    assert parse_resolve_args(["API.x.lab=127.0.0.1:6443", "d=[::1]:1"]) == {"api.x.lab": "127.0.0.1:6443",
                                                                              "d": "::1:1"}
    for bad in ["api.x.lab", "=1.2.3.4:5", "a=1.2.3.4", "a=1.2.3.4:x", "a=1.2.3.4:70000"]:
        with pytest.raises(ValueError, match="host=ip:port"):
            parse_resolve_args([bad])


async def test_override_resolver_maps_any_port_and_falls_back_to_dns():
    from gateway.resolve import OverrideResolver
    resolver = OverrideResolver({"api.x.lab": "127.0.0.1:6443"})
    try:
        [hit] = await resolver.resolve("API.x.lab", 443)
        assert (hit["host"], hit["port"]) == ("127.0.0.1", 6443)
        fallback = await resolver.resolve("localhost", 80)
        assert fallback and all(r["port"] == 80 for r in fallback)
    finally:
        await resolver.close()


def test_registry_survives_pickling_for_worker_processes(certs):
    import pickle
    cp, secret = make_objects("b", certs[0])
    reg = Registry.from_objects(cluster_uuid="a", clusterpeers=[cp], peer_secrets=[secret], capabilities=[],
                                generation=3)
    copy = pickle.loads(pickle.dumps(reg))
    assert copy == reg and copy.by_fingerprint[fp(certs[0])] is copy.peers["b"]
    assert not pickle.loads(pickle.dumps(Registry.empty())).loaded
