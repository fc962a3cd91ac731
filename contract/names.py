"""Names both sides of the module compute, each once (docs/internals.md lists them with their readers)."""

from __future__ import annotations

import hashlib
import re

NAMESPACE = "d8-peering"
"""The module's namespace: its Secrets, its Lease, its DexClient."""

GROUP = "peering.deckhouse.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# --- labels and bounded names ------------------------------------------------------------------------------------

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "peering"
MANAGED_BY_SELECTOR = f"{MANAGED_BY}={MANAGED_BY_VALUE}"
CLUSTERPEER_LABEL = "peering.deckhouse.io/clusterpeer"
CAPABILITY_LABEL = "peering.deckhouse.io/capability"

_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _digest(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def bounded_name(name: str, limit: int = 253) -> str:
    """`name` when it fits in `limit`, else its head and a hash of the whole, so distinct names stay distinct."""
    if len(name) <= limit:
        return name
    return name[: limit - 11] + "-" + _digest(name)


def label_value(text: str) -> str:
    """A valid label value (≤ 63 characters) standing for `text`: itself when valid, else head and hash.

    ClusterPeer and capability names may be up to 253 characters, label values only 63.
    """
    if len(text) <= 63 and _LABEL_VALUE_RE.match(text):
        return text
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", text)[:52].rstrip("-_.")
    head = head.lstrip("-_.")
    return f"{head}-{_digest(text)}" if head else _digest(text)


# --- one peering -------------------------------------------------------------------------------------------------

PEER_SECRET_PREFIX = "peer-"
PROVIDER_PREFIX = "peering-"


def peer_secret_name(clusterpeer: str) -> str:
    """The Secret with a peering's credentials (docs/internals.md)."""
    return bounded_name(PEER_SECRET_PREFIX + clusterpeer)


def provider_name(clusterpeer: str) -> str:
    """The peering's TokenExchangeProvider, which is also the Dex connector the gateway names in the exchange."""
    return bounded_name(PROVIDER_PREFIX + clusterpeer)


UUID_CLAIM_PREFIX = "peer-uuid-"
UUID_CLAIM_LABEL = "peering.deckhouse.io/uuid-claim"
"""Labels each claim Lease with the cluster UUID it claims (the leader election's Lease has no such label)."""


def uuid_claim_name(cluster_uuid: str) -> str:
    """The coordination.k8s.io/v1 Lease in the module namespace by which one ClusterPeer claims a peer cluster UUID
    (control/uuid_claim.py): the API server lets one create of a name succeed, so two peerings of this cluster
    never stand for the same cluster UUID, whichever replicas and workers join at once. The UUID lower-cased, as
    the rule compares it."""
    return UUID_CLAIM_PREFIX + cluster_uuid.lower()


AUDIENCE_PREFIX = "peering.deckhouse.io/"


def audience(cluster_uuid: str, capability: str) -> str:
    """The audience of a consumer token for `capability` of the cluster `cluster_uuid`: a consumer asks for it,
    the egress reviews with it, the entrance of that cluster checks it."""
    return f"{AUDIENCE_PREFIX}{cluster_uuid}/{capability}"


SA_PREFIX = "system:serviceaccount:"


def username_prefix(identity: str) -> str:
    """The prefix of a peer's consumers' usernames in this cluster (the TokenExchangeProvider's usernamePrefix).

    `identity` is `peering_identity` of this cluster's ClusterPeer of that peering: assigned by this cluster's API
    server, never the cluster UUID the peer claims, so no two peerings share a prefix and no peer can choose one."""
    return f"peering:{identity}:"


def consumer_username(identity: str, namespace: str, name: str) -> str:
    """The user a peer's ServiceAccount becomes here after the exchange; the grants bind it."""
    return f"{username_prefix(identity)}{SA_PREFIX}{namespace}:{name}"


def peering_identity(clusterpeer: dict) -> str:
    """The peer's identity in this cluster: the `metadata.uid` of this cluster's ClusterPeer of the peering.

    The API server assigns it at creation; it is unique among all objects ever created in this cluster and never
    reused, so a peering deleted and made anew gets a new identity, and the grants of one peering never name the
    consumers of another. ValueError when the object has none (it was not read from an API server)."""
    uid = ((clusterpeer or {}).get("metadata") or {}).get("uid")
    if not isinstance(uid, str) or not uid:
        raise ValueError("the ClusterPeer has no metadata.uid: read it from the API server before deriving its "
                         "identity")
    return uid


EGRESS_HOST = f"peering-gateway.{NAMESPACE}.svc"
EGRESS_BASE_URL = f"https://{EGRESS_HOST}"


def egress_endpoint(clusterpeer: str) -> str:
    """The egress URL through which local consumers reach the peer's Kubernetes API (status.access.endpoint)."""
    return f"{EGRESS_BASE_URL}/peers/{clusterpeer}"


# --- the module's own objects ------------------------------------------------------------------------------------

CA_SECRET = "peering-ca"
ENTRANCE_TLS_SECRET = "peering-gateway-tls"
EGRESS_TLS_SECRET = "peering-egress-tls"
JOIN_TLS_SECRET = "peering-join-tls"
CLUSTER_UUID_NAMESPACE = "kube-system"
CLUSTER_UUID_CONFIGMAP = "d8-cluster-uuid"
CLUSTER_UUID_KEY = "cluster-uuid"

DEX_CLIENT_NAME = "peering"
"""The chart's DexClient; user-authn derives the client ID and the Secret from its name and namespace."""
DEX_AUDIENCE = "kubernetes"
"""The Dex client kube-apiserver accepts tokens for (Deckhouse's AuthenticationConfiguration audience)."""


def dex_client_id(name: str = DEX_CLIENT_NAME, namespace: str = NAMESPACE) -> str:
    return f"dex-client-{name}@{namespace}"


def dex_client_secret_name(name: str = DEX_CLIENT_NAME) -> str:
    """The Secret user-authn writes for the DexClient `name`; its key is `clientSecret`."""
    return f"dex-client-{name}"
