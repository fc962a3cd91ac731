"""The objects the story applies, as kubectl reads them from stdin, the files it writes for kubectl (a token's
kubeconfig, owner-readable only), and how a one-time secret is shown or made stale."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import os
import pathlib

import yaml

# What the story creates. The capability belongs to an imaginary module "mirror" whose controller, in both
# clusters, reads the ConfigMaps of the paired projects of the other cluster.
CAPABILITY = "mirror-configmaps"
CAPABILITY_VERSION = "v1"
MODULE_NS = "d8-mirror"
CONSUMER = "mirror-controller"
BYSTANDER = "mirror-bystander"
PROJECT = "shop"
AUDITOR = "auditor"


def module_config_manifest(enabled: bool = True) -> str:
    """The guide's ModuleConfig of the peering module, as its "Enabling the module" writes it."""
    return yaml.safe_dump({"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig",
                           "metadata": {"name": "peering"}, "spec": {"enabled": enabled}}, sort_keys=False)


def invite_manifest(name: str, ttl: str = "1h", expected_cluster_uuid: str | None = None,
                    capabilities: list[str] | None = None) -> str:
    spec: dict = {"type": "Invite", "invite": {"tokenTTL": ttl}}
    if expected_cluster_uuid:
        spec["invite"]["expectedClusterUUID"] = expected_cluster_uuid
    if capabilities:
        spec["capabilities"] = capabilities
    return yaml.safe_dump({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                           "metadata": {"name": name}, "spec": spec}, sort_keys=False)


def join_manifest(name: str, connection_string: str, capabilities: list[str] | None = None) -> str:
    spec: dict = {"type": "Join", "join": {"connectionString": connection_string}}
    if capabilities:
        spec["capabilities"] = capabilities
    return yaml.safe_dump({"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                           "metadata": {"name": name}, "spec": spec}, sort_keys=False, width=10_000)


def module_manifest() -> str:
    """The imaginary module "mirror": its namespace, its controller's ServiceAccount (the consumer), another
    ServiceAccount that is not a consumer, and the PeeringCapability it declares."""
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MODULE_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CONSUMER, "namespace": MODULE_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": BYSTANDER, "namespace": MODULE_NS}},
        {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "PeeringCapability",
         "metadata": {"name": CAPABILITY},
         "spec": {"version": CAPABILITY_VERSION,
                  "consumers": [{"kind": "ServiceAccount", "namespace": MODULE_NS, "name": CONSUMER}],
                  "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def project_manifest(cluster: str) -> str:
    """Project `shop` with its main namespace (as Deckhouse multitenancy makes them) and a ConfigMap that says
    which cluster it lives in."""
    docs = [
        {"apiVersion": "deckhouse.io/v1alpha3", "kind": "Project", "metadata": {"name": PROJECT}, "spec": {}},
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": PROJECT, "labels": {"projects.deckhouse.io/project": PROJECT}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"price-list-{cluster}", "namespace": PROJECT},
         "data": {"cluster": cluster}},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def auditor_manifest() -> str:
    """A person who may read peerings (the module's d8:user-authz:peering:user) but not their sensitive fields."""
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": AUDITOR, "namespace": "default"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "auditor-peering-viewer"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "d8:user-authz:peering:user"},
         "subjects": [{"kind": "ServiceAccount", "name": AUDITOR, "namespace": "default"}]},
    ]
    return yaml.safe_dump_all(docs, sort_keys=False)


def write_token_kubeconfig(path: pathlib.Path, server: str, ca_pem: bytes, token: str,
                           tls_server_name: str | None = None) -> pathlib.Path:
    cluster: dict = {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "c", "cluster": cluster}],
           "users": [{"name": "u", "user": {"token": token}}],
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
           "current-context": "c"}
    write_private(path, yaml.safe_dump(doc, sort_keys=False))
    return path


def write_private(path: pathlib.Path, text: str) -> None:
    """Write a file that holds a token: readable by its owner only, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def expired_copy(connection_string: str) -> str:
    """The same invitation with its expiry an hour ago, checksum recomputed: what a string looks like when it was
    left lying around past its tokenTTL (the guide's smallest TTL is ten minutes, too long to wait for)."""
    from control import connstring

    inv = connstring.decode(connection_string, now=datetime.datetime.now(datetime.timezone.utc))
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    return connstring.encode(dataclasses.replace(inv, expires_at=past))


def shorten(secret_text: str) -> str:
    """A one-time secret as the demo shows it: enough to recognise, not enough to use."""
    return f"{secret_text[:16]}...({len(secret_text)} characters, shown shortened)"
