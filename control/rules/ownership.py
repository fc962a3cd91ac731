"""Labels and owner references of everything the module writes (docs/internals.md), and bounded names."""

from __future__ import annotations

from contract.names import (API_VERSION as CLUSTERPEER_API_VERSION, CAPABILITY_LABEL, CLUSTERPEER_LABEL,
                            MANAGED_BY, MANAGED_BY_VALUE, bounded_name, label_value)

__all__ = ["CLUSTERPEER_API_VERSION", "CAPABILITY_LABEL", "CLUSTERPEER_LABEL", "MANAGED_BY", "MANAGED_BY_VALUE",
           "bounded_name", "label_value", "labels", "selector", "owner_reference", "owner_names", "belongs_to"]


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


def owner_names(obj: dict) -> list[str]:
    """Names of the ClusterPeers owning `obj` (its ownerReferences of kind ClusterPeer)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [r["name"] for r in refs if isinstance(r, dict) and r.get("kind") == "ClusterPeer" and r.get("name")]


def belongs_to(obj: dict, clusterpeer: str) -> bool:
    """Whether the module wrote `obj` for this ClusterPeer (the only objects a diff may delete)."""
    got = (obj.get("metadata") or {}).get("labels") or {}
    return got.get(MANAGED_BY) == MANAGED_BY_VALUE and got.get(CLUSTERPEER_LABEL) == label_value(clusterpeer)
