"""Paired projects and their ProjectPeer objects (DESIGN.md §9).

A local project is a Project (deckhouse.io, v1alpha3 or v1alpha2) with its namespaces: the main namespace named as
the project, those labelled `projects.deckhouse.io/project=<name>` (multitenancy-manager labels the main one and
every `ProjectNamespace`-made one), and those its status lists (v1alpha3: `[{name, kind: Main|Additional}]`;
v1alpha2: `[name]`), each only while the namespace exists. Same-named projects of both sides pair; each pair gets one ProjectPeer
per peer, in the project's main namespace, named after the ClusterPeer. A pair whose project is gone on either
side loses its ProjectPeer (and its Roles, through the grants).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from control.rules import ownership
from control.rules.effective import EffectiveCapability

PROJECT_LABEL = "projects.deckhouse.io/project"
API_VERSION = "peering.deckhouse.io/v1alpha1"
PAIRED = "Paired"
PEER_UNREACHABLE = "PeerUnreachable"


def status_namespaces(project: dict) -> list[str]:
    """The namespaces a Project's status lists, in either served shape (v1alpha3 objects, v1alpha2 strings)."""
    listed = (project.get("status") or {}).get("namespaces") if isinstance(project.get("status"), dict) else None
    out = []
    for item in listed if isinstance(listed, list) else []:
        name = item.get("name") if isinstance(item, dict) else item
        if isinstance(name, str) and name:
            out.append(name)
    return out


def local_projects(projects: Iterable[dict], namespaces: Iterable[dict]) -> dict[str, list[str]]:
    """{project: sorted namespaces} from Project objects and Namespace objects; a project keeps only existing
    namespaces."""
    listed: dict[str, set[str]] = {}
    for p in projects:
        name = (p.get("metadata") or {}).get("name") if isinstance(p, dict) else None
        if isinstance(name, str) and name:
            listed[name] = {name, *status_namespaces(p)}
    out: dict[str, set[str]] = {n: set() for n in listed}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        ns_name = meta.get("name")
        if not ns_name:
            continue
        for project, names in listed.items():
            if ns_name in names:
                out[project].add(ns_name)
        owner = (meta.get("labels") or {}).get(PROJECT_LABEL)
        if owner in listed:
            out[owner].add(ns_name)
    return {k: sorted(v) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class Pair:
    project: str
    local_namespaces: tuple[str, ...]
    remote_namespaces: tuple[str, ...]


def pair_projects(local: Mapping[str, Iterable[str]], peer_projects: list[dict] | None) -> list[Pair]:
    """Same-named projects of both sides whose main namespace exists here (where the ProjectPeer lives)."""
    remote = {}
    for p in peer_projects or []:
        if isinstance(p, dict) and isinstance(p.get("name"), str):
            remote.setdefault(p["name"], tuple(sorted(set(p.get("namespaces") or []))))
    pairs = []
    for name in sorted(set(local) & set(remote)):
        local_ns = tuple(sorted(set(local[name])))
        if name in local_ns:
            pairs.append(Pair(name, local_ns, remote[name]))
    return pairs


def paired_namespaces(pairs: Iterable[Pair]) -> list[str]:
    """Every local namespace of every paired project: where project-scope grants go."""
    return sorted({ns for p in pairs for ns in p.local_namespaces})


def desired_project_peers(
    clusterpeer: dict,
    peer_uuid: str,
    pairs: Iterable[Pair],
    effective: Iterable[EffectiveCapability],
    *,
    reachable: bool,
    reason: str = "",
    message: str = "",
) -> list[dict]:
    """One ProjectPeer per pair, with its status. When the peer is unreachable the pairs of the last known offer
    stay, in state PeerUnreachable with the caller's reason and message."""
    cp_name = clusterpeer["metadata"]["name"]
    alias = ((clusterpeer.get("status") or {}).get("peer") or {}).get("alias") or cp_name
    project_caps = [
        {"name": c.name, "version": c.version, "scope": list(c.scope)}
        for c in sorted(effective, key=lambda c: c.name)
        if "project" in c.scope
    ]
    out = []
    for pair in pairs:
        if reachable:
            status = {
                "state": PAIRED,
                "reason": PAIRED,
                "message": f"paired with project {pair.project} of cluster {peer_uuid} ({alias})",
            }
        else:
            status = {
                "state": PEER_UNREACHABLE,
                "reason": reason or PEER_UNREACHABLE,
                "message": message or f"cluster {peer_uuid} did not answer; the pairing stays and is retried",
            }
        status.update(
            {
                "clusterUUID": peer_uuid,
                "remoteNamespaces": list(pair.remote_namespaces),
                "capabilities": project_caps,
            }
        )
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ProjectPeer",
                "metadata": {
                    "name": cp_name,
                    "namespace": pair.project,
                    "labels": ownership.labels(cp_name),
                    "ownerReferences": [ownership.owner_reference(clusterpeer)],
                },
                "status": status,
            }
        )
    return out


def status_updates(desired: Iterable[dict], existing: Iterable[dict]) -> list[dict]:
    """Desired ProjectPeers whose status differs from the existing object's (to write through /status);
    each carries the existing resourceVersion. Objects still to be created are not included."""
    have = {((o.get("metadata") or {}).get("namespace"), (o.get("metadata") or {}).get("name")): o for o in existing}
    out = []
    for obj in desired:
        cur = have.get((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        if cur is not None and cur.get("status") != obj["status"]:
            meta = dict(obj["metadata"])
            rv = (cur.get("metadata") or {}).get("resourceVersion")
            if rv:
                meta["resourceVersion"] = rv
            out.append({**obj, "metadata": meta})
    return out


def pairs_count(pairs: Iterable[Pair]) -> int:
    """status.pairedProjectsCount."""
    return sum(1 for _ in pairs)
