"""user-authn as a module of a lab cluster: the part of its settings the lab reads, and the Dex clients user-authn
makes of them and of DexClients (lab/userauthn.py is its TokenExchangeProvider controller).

What Deckhouse's user-authn renders, and this reproduces:

- Dex's `kubernetes` OAuth2 client, the audience kube-apiserver accepts, exists only while `publishAPI.enabled` is
  on, `kubeconfigGenerator` has an entry, or a DexAuthenticator has `spec.allowAccessToKubernetes`
  (modules/150-user-authn templates/dex/oauth2client.yaml). Without it every exchange asking the scope
  `audience:server:client_id:kubernetes` fails in Dex's newIDToken, which upstream Dex answers 500 `server_error`
  (lab/dex.py). `publishAPI.enabled` is false by default. The lab serves no DexAuthenticator, so here it is the
  first two.
- A DexClient `<name>` in namespace `<ns>` becomes the Dex client `dex-client-<name>@<ns>`, whose secret user-authn
  writes into Secret `<ns>/dex-client-<name>`, key `clientSecret` only (the ID is derived). With the annotation
  `dexclient.deckhouse.io/allow-access-to-kubernetes: "true"` it is in the `kubernetes` client's trustedPeers.

The lab gives every DexClient the cluster's one client secret (`LabCluster.dex_client_secret`), so a test can
compare what the module read; real user-authn makes a random one per DexClient.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

from lab.dex import Dex

MODULE = "user-authn"
NAMESPACE = "d8-user-authn"
KUBERNETES_CLIENT_ID = "kubernetes"
ALLOW_ACCESS_ANNOTATION = "dexclient.deckhouse.io/allow-access-to-kubernetes"
DEX_CLIENT_SECRET_KEY = "clientSecret"
# The peering module's DexClient, as its chart templates it.
MODULE_DEX_CLIENT_NAME = "peering"
MODULE_NAMESPACE = "d8-peering"

# The settings of user-authn's ModuleConfig that the lab reads, in the shape of user-authn's
# openapi/config-values.yaml (whose x-config-version is 2); any other setting is refused as unknown.
SETTINGS_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "publishAPI": {
            "type": "object", "default": {},
            "properties": {
                "enabled": {"type": "boolean", "default": False},
                "ingressClass": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                                                              r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
                "addKubeconfigGeneratorEntry": {"type": "boolean", "default": True},
            },
        },
        "kubeconfigGenerator": {
            "type": "array",
            "items": {"type": "object", "required": ["id", "masterURI"],
                      "properties": {"id": {"type": "string", "pattern": r"^[\@\.\:0-9a-z._-]+$"},
                                     "masterURI": {"type": "string"}, "description": {"type": "string"},
                                     "masterCA": {"type": "string"}}},
        },
    },
}


def dex_client_id(name: str, namespace: str) -> str:
    """The Dex client ID user-authn gives DexClient `name` in `namespace`."""
    return f"dex-client-{name}@{namespace}"


def dex_client_secret_name(name: str) -> str:
    """The Secret (in the DexClient's namespace) in which user-authn writes the client's secret."""
    return f"dex-client-{name}"


MODULE_DEX_CLIENT_ID = dex_client_id(MODULE_DEX_CLIENT_NAME, MODULE_NAMESPACE)
MODULE_DEX_CLIENT_SECRET_NAME = dex_client_secret_name(MODULE_DEX_CLIENT_NAME)


def dex_client_secret(name: str, namespace: str, secret: str) -> dict:
    """The Secret user-authn writes for DexClient `name`: key `clientSecret` only (the ID is derived)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": dex_client_secret_name(name), "namespace": namespace},
            "data": {DEX_CLIENT_SECRET_KEY: base64.b64encode(secret.encode()).decode()}}


def kubernetes_client_wanted(settings: Mapping[str, Any] | None) -> bool:
    """Whether user-authn renders Dex's `kubernetes` client for these settings (the lab has no DexAuthenticator)."""
    settings = settings or {}
    publish = settings.get("publishAPI") if isinstance(settings.get("publishAPI"), Mapping) else {}
    return publish.get("enabled") is True or bool(settings.get("kubeconfigGenerator"))


@dataclass(frozen=True)
class DexClientSpec:
    """A DexClient as user-authn reads it: where it lives and whether it may ask for the `kubernetes` audience."""

    name: str
    namespace: str
    allow_access_to_kubernetes: bool

    @property
    def client_id(self) -> str:
        return dex_client_id(self.name, self.namespace)

    @classmethod
    def of(cls, obj: Mapping) -> "DexClientSpec":
        meta = obj.get("metadata") or {}
        allow = str((meta.get("annotations") or {}).get(ALLOW_ACCESS_ANNOTATION, "")).lower() == "true"
        return cls(meta.get("name", ""), meta.get("namespace", ""), allow)


class DexClients:
    """The Dex clients user-authn keeps: one per DexClient it was given, and `kubernetes` while the settings want
    it, trusting the DexClients allowed access. `apply` makes Dex's clients match."""

    def __init__(self, dex: Dex, client_secret: str) -> None:
        self.dex = dex
        self.client_secret = client_secret
        self.kubernetes_secret = secrets.token_urlsafe(32)
        self.settings: Mapping[str, Any] = {}
        self.clients: dict[str, DexClientSpec] = {}

    def set_settings(self, settings: Mapping[str, Any] | None) -> None:
        self.settings = dict(settings or {})
        self.apply()

    def add(self, spec: DexClientSpec) -> str:
        self.clients[spec.client_id] = spec
        self.apply()
        return spec.client_id

    def remove(self, spec: DexClientSpec) -> None:
        self.clients.pop(spec.client_id, None)
        self.apply()

    def apply(self) -> None:
        for client_id in [c for c in self.dex.clients if c != KUBERNETES_CLIENT_ID and c not in self.clients]:
            del self.dex.clients[client_id]
        for spec in self.clients.values():
            if spec.client_id not in self.dex.clients:
                self.dex.add_client(spec.client_id, self.client_secret)
        if kubernetes_client_wanted(self.settings):
            peers = [s.client_id for s in self.clients.values() if s.allow_access_to_kubernetes]
            self.dex.add_client(KUBERNETES_CLIENT_ID, self.kubernetes_secret, peers)
        else:
            self.dex.clients.pop(KUBERNETES_CLIENT_ID, None)
