"""Labels and owner references of everything the module writes (docs/internals.md), and bounded names."""

from __future__ import annotations

import hashlib
import re

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "peering"
CLUSTERPEER_LABEL = "peering.deckhouse.io/clusterpeer"
CAPABILITY_LABEL = "peering.deckhouse.io/capability"
CLUSTERPEER_API_VERSION = "peering.deckhouse.io/v1alpha1"

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


def labels(clusterpeer: str, capability: str | None = None) -> dict[str, str]:
    out = {MANAGED_BY: MANAGED_BY_VALUE, CLUSTERPEER_LABEL: label_value(clusterpeer)}
    if capability is not None:
        out[CAPABILITY_LABEL] = label_value(capability)
    return out


def selector(clusterpeer: str) -> str:
    """The label selector that finds every object written for one ClusterPeer."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{CLUSTERPEER_LABEL}={label_value(clusterpeer)}"


def owner_reference(clusterpeer: dict) -> dict:
    """ownerReference to a ClusterPeer object (needs metadata.name and metadata.uid)."""
    meta = clusterpeer.get("metadata") or {}
    if not meta.get("name") or not meta.get("uid"):
        raise ValueError("the ClusterPeer needs metadata.name and metadata.uid to own objects")
    return {
        "apiVersion": CLUSTERPEER_API_VERSION,
        "kind": "ClusterPeer",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": False,
    }


def belongs_to(obj: dict, clusterpeer: str) -> bool:
    """Whether the module wrote `obj` for this ClusterPeer (the only objects a diff may delete)."""
    got = (obj.get("metadata") or {}).get("labels") or {}
    return got.get(MANAGED_BY) == MANAGED_BY_VALUE and got.get(CLUSTERPEER_LABEL) == label_value(clusterpeer)
