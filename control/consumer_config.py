"""What a module's controller needs to call a peer's Kubernetes API: `peering kubeconfig`.

A controller of a module (a consumer of a PeeringCapability) reaches the peer through this cluster's egress, with a
projected ServiceAccount token whose audience names the peer and the capability. Everything it needs is in the
ClusterPeer's `status.access` (endpoint, CA bundle, one audience per effective capability); this module turns it
into a kubeconfig (read by the official Kubernetes clients, client-go and the Python one alike) and into the Pod
fragments that mount it and project the token. Pure functions over a ClusterPeer; `fetch` reads it through the
API with nothing beyond `get clusterpeers` (the viewer role).
"""

from __future__ import annotations

import dataclasses
import re

import yaml

from contract import reasons
from contract.errors import InputError
from contract.names import GROUP

DEFAULT_TOKEN_DIR = "/var/run/secrets/peering.deckhouse.io"
TOKEN_SECONDS = 3600
"""Lifetime asked for the projected token; kubelet renews it at 80% of that, and the clients read the file anew."""

_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class ConsumerConfigError(InputError):
    """A peering or capability that cannot give a consumer a kubeconfig; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Access:
    """One capability's access to one peer, from `status.access`."""

    clusterpeer: str
    capability: str
    endpoint: str
    ca_bundle: str
    audience: str

    @property
    def slug(self) -> str:
        """A name for the volume and the ConfigMap: DNS-1123, at most 63 characters."""
        text = re.sub(r"[^a-z0-9-]", "-", f"peering-{self.clusterpeer}-{self.capability}".lower()).strip("-")
        return text[:63].rstrip("-")


def access_of(clusterpeer: dict, capability: str) -> Access:
    """The access of `capability` in a ClusterPeer, or a ConsumerConfigError saying what is missing."""
    name = (clusterpeer.get("metadata") or {}).get("name") or ""
    status = clusterpeer.get("status") if isinstance(clusterpeer.get("status"), dict) else {}
    access = status.get("access") if isinstance(status.get("access"), dict) else None
    if access is None or not access.get("endpoint") or not access.get("caBundle"):
        phase = status.get("phase") or "not reconciled yet"
        raise ConsumerConfigError("NotEstablished", f"ClusterPeer {name} has no status.access yet (phase {phase}): "
                                                    "the peering is not established; see `kubectl get clusterpeer "
                                                    f"{name}` and its Ready condition")
    audiences = {a.get("capability"): a.get("audience") for a in access.get("audiences") or []
                 if isinstance(a, dict)}
    if capability not in audiences:
        effective = ", ".join(sorted(c for c in audiences if c)) or "none"
        raise ConsumerConfigError("NotEffective", f"capability {capability} is not effective in peering {name} "
                                                  f"(effective: {effective}); both clusters must list it in "
                                                  "spec.capabilities and accept it")
    return Access(name, capability, access["endpoint"], access["caBundle"], audiences[capability])


def token_path(access: Access, token_dir: str = DEFAULT_TOKEN_DIR) -> str:
    return f"{token_dir.rstrip('/')}/{access.slug}/token"


def kubeconfig(access: Access, token_file: str) -> dict:
    """A kubeconfig naming the egress endpoint, the peering CA and the projected token's file."""
    import base64

    name = access.slug
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
        "clusters": [{"name": name, "cluster": {
            "server": access.endpoint,
            "certificate-authority-data": base64.b64encode(access.ca_bundle.encode()).decode()}}],
        "users": [{"name": name, "user": {"tokenFile": token_file}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


def manifest(access: Access, token_dir: str = DEFAULT_TOKEN_DIR, kubeconfig_dir: str | None = None) -> list[dict]:
    """The ConfigMap with the kubeconfig, and the Pod fragment (volumes, volumeMounts) that projects the token
    with the capability's audience next to it. Apply the ConfigMap in the controller's namespace."""
    kubeconfig_dir = kubeconfig_dir or f"{token_dir.rstrip('/')}/{access.slug}-kubeconfig"
    token_file = token_path(access, token_dir)
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{access.slug}-kubeconfig"[:253],
                     "labels": {f"{GROUP}/clusterpeer": access.clusterpeer[:63],
                                f"{GROUP}/capability": access.capability[:63]}},
        "data": {"kubeconfig": yaml.safe_dump(kubeconfig(access, token_file), sort_keys=False)},
    }
    pod = {"spec": {
        "volumes": [
            {"name": access.slug, "projected": {"sources": [{"serviceAccountToken": {
                "audience": access.audience, "expirationSeconds": TOKEN_SECONDS, "path": "token"}}]}},
            {"name": f"{access.slug}-kubeconfig", "configMap": {"name": config_map["metadata"]["name"]}},
        ],
        "containers": [{"name": "<your controller>", "env": [
            {"name": "PEERING_KUBECONFIG", "value": f"{kubeconfig_dir}/kubeconfig"}],
            "volumeMounts": [
                {"name": access.slug, "mountPath": token_file.rsplit("/", 1)[0], "readOnly": True},
                {"name": f"{access.slug}-kubeconfig", "mountPath": kubeconfig_dir, "readOnly": True}]}],
    }}
    return [config_map, pod]


def check_names(peer: str, capability: str) -> None:
    for what, value in (("--peer", peer), ("--capability", capability)):
        if not value or len(value) > 253 or not _NAME.fullmatch(value):
            raise ConsumerConfigError("InvalidName", f"{what} {value!r} is not a Kubernetes object name: give the "
                                                     "name of the ClusterPeer and of the PeeringCapability")


async def fetch(kubeconfig_path: str | None, peer: str) -> dict:
    """The ClusterPeer `peer`, read with the caller's kubeconfig."""
    from control.kube import CLUSTERPEERS, ApiError, KubeSession, NotFound

    async with await KubeSession.connect(kubeconfig_path) as kube:
        try:
            return await kube.get(CLUSTERPEERS, peer)
        except NotFound:
            raise ConsumerConfigError(reasons.PEER_NOT_FOUND, f"there is no ClusterPeer {peer}; "
                                      "`kubectl get clusterpeers` lists the peerings of this cluster") from None
        except ApiError as exc:
            raise ConsumerConfigError(exc.reason or "ApiError", f"reading ClusterPeer {peer} failed: {exc.code} "
                                                               f"{exc.message[:300]}") from None


def render(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)
