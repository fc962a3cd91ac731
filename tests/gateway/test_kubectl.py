"""kubectl through the entrance against the lab's API server (the emulator, and a real kube-apiserver) and Dex:
the whole entrance path for real.

kubectl presents the peer's client certificate and a ServiceAccount token of the peer's issuer; the gateway
verifies it, exchanges it at the lab's Dex (which names the user with the peer's prefix), and the API server
authenticates the exchanged ID token over OIDC and authorizes it with RBAC.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.gateway.support import ENTRANCE_HOST, ISSUER, PEER_UUID, Handlers, b64, load_certs
from gateway.config import GatewayConfig
from gateway.registry import Registry
from gateway.server import Gateway
from lab.testing import apiserver_backends

KUBECTL = str(Path(sys.executable).with_name("kubectl"))
USER = f"peering:{PEER_UUID}:system:serviceaccount:mod:controller"


def _token(key, cluster_uuid: str) -> str:
    from tests.gateway.support import make_token
    return make_token(key, aud=[f"peering.deckhouse.io/{cluster_uuid}/read-pods"])


def _registry(pki, issuer_key, cluster_uuid: str) -> Registry:
    cp = {"metadata": {"name": "peer"}, "status": {"effectiveCapabilities": ["read-pods"], "peer": {
        "clusterUUID": PEER_UUID, "issuer": {"url": ISSUER, "jwks": json.dumps(
            {"keys": [issuer_key.export_public(as_dict=True)]})}}}}
    secret = {"metadata": {"name": "peer-peer"}, "data": {"issued.crt": b64(pki["peer"].cert_chain_pems[0].bytes())}}
    cap = {"metadata": {"name": "read-pods"}, "spec": {"version": "v1", "consumers": [
        {"namespace": "mod", "name": "controller"}]}, "status": {"conditions": [{"type": "Accepted", "status": "True"}]}}
    return Registry.from_objects(cluster_uuid=cluster_uuid, clusterpeers=[cp], peer_secrets=[secret],
                                 capabilities=[cap], generation=1)


@pytest.fixture(params=apiserver_backends())
async def lab_cluster(request, tmp_path):
    """Cluster a on the lab's emulator, or on a real kube-apiserver trusting the lab's Dex as Deckhouse's does."""
    from lab.testing import lab_clusters
    async with lab_clusters(tmp_path / "lab", ["a"], peering_command=None, apiserver=request.param) as lab:
        yield lab["a"]


async def test_kubectl_get_and_watch_through_the_entrance(lab_cluster, pki, issuer_key, tmp_path):
    from lab.cluster import DEX_CLIENT_ID
    c = lab_cluster
    c.dex.set_connector("peering-peer", ISSUER, {"keys": [issuer_key.export_public(as_dict=True)]},
                        username_prefix=f"peering:{PEER_UUID}:")
    c.api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                  "metadata": {"name": "peer-view"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]})
    c.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "first", "namespace": "default"},
                  "data": {"k": "v"}})
    public_ca = c.pki.public_ca.cert_pem
    cfg = GatewayConfig(public_domain_template="%s.a.lab", api_server="https://api.a.lab", api_ca_pem=public_ca,
                        dex_url=c.dex_issuer, dex_ca_pem=public_ca, dex_client_id=DEX_CLIENT_ID,
                        dex_client_secret=lambda: c.dex_client_secret, resolve=c.resolve_map(), access_log=False)
    gw = Gateway(cfg, Handlers())
    await gw.start()
    watcher = None
    try:
        load_certs(gw, pki)
        gw.publish(_registry(pki, issuer_key, c.uuid))
        kubeconfig = tmp_path / "peer-kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "peer",
            "clusters": [{"name": "a", "cluster": {"server": f"https://127.0.0.1:{gw.entrance_port}",
                                                   "tls-server-name": ENTRANCE_HOST,
                                                   "certificate-authority-data": b64(pki["ca"].cert_pem.bytes())}}],
            "users": [{"name": "peer", "user": {
                "client-certificate-data": b64(pki["peer"].cert_chain_pems[0].bytes()),
                "client-key-data": b64(pki["peer"].private_key_pem.bytes()),
                "token": _token(issuer_key, c.uuid)}}],
            "contexts": [{"name": "peer", "context": {"cluster": "a", "user": "peer"}}]}))
        kubeconfig.chmod(0o600)
        env = {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

        get = await asyncio.create_subprocess_exec(KUBECTL, "get", "configmaps", "-n", "default", "-o", "name",
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                   env=env)
        out, err = await asyncio.wait_for(get.communicate(), 30)
        assert get.returncode == 0, err.decode()
        assert out.decode().split() == ["configmap/first"]

        watcher = await asyncio.create_subprocess_exec(KUBECTL, "get", "configmaps", "-n", "default", "-w",
                                                       "-o", "name", stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE, env=env)
        async with asyncio.timeout(30):
            assert (await watcher.stdout.readline()).decode().strip() == "configmap/first"
            c.api.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "second", "namespace": "default"}})
            assert (await watcher.stdout.readline()).decode().strip() == "configmap/second"

        # The user kubectl acted as is the peer's consumer, named with the peer's prefix, by an exchanged token.
        denied = await asyncio.create_subprocess_exec(KUBECTL, "get", "secrets", "-n", "default",
                                                      stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                      env=env)
        _, err = await asyncio.wait_for(denied.communicate(), 30)
        assert denied.returncode != 0 and USER in err.decode()
        assert c.dex.exchange_calls == 1
    finally:
        if watcher is not None and watcher.returncode is None:
            watcher.kill()
            await watcher.wait()
        await gw.stop()
