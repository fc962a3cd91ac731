"""The claim of a peer cluster UUID: the one write that makes "two ClusterPeers of this cluster never stand for the
same peer cluster UUID" (ClusterUUIDInUse) hold across replicas and workers.

The rule's check against the informers' caches (`rules.join.uuids_in_use`) cannot make it atomic: two joins toward
different ClusterPeers pass it together while neither sees the other's write. So before anything of a peering is
stored, the side that is about to stand for a peer's UUID creates a coordination.k8s.io/v1 Lease named from that
UUID (`contract.names.uuid_claim_name`) in the module namespace, held by its ClusterPeer (spec.holderIdentity its
name, an ownerReference its uid: garbage collection removes the claim with the ClusterPeer). Of any number of
concurrent creates of one name the API server lets exactly one succeed; the others read the claim and:

- it is held by the same ClusterPeer (its uid in ownerReferences): it is ours, taken by an earlier attempt of this
  join (a retry, a crash between the claim and the next write, another replica answering the same joiner);
- it is held by a ClusterPeer that no longer exists under that uid, or is being deleted (a fresh read, never the
  cache): it is taken over, deleted with the uid and resourceVersion read as preconditions and created again; a
  conflict means another join got there first, and the claim is read again;
- it is held by another live ClusterPeer: `UUIDClaimed`, whose message is ClusterUUIDInUse's naming that one.

A claim is released (`release`) only by its holder, with preconditions, where its join is known to have lost.
"""

from __future__ import annotations

from contract.names import (MANAGED_BY, MANAGED_BY_VALUE, UUID_CLAIM_LABEL, CLUSTERPEER_LABEL, label_value,
                            uuid_claim_name)
from control.kube import CLUSTERPEERS, LEASES, AlreadyExists, Conflict, KubeSession, NotFound
from control.rules import join as join_rules
from control.rules import ownership

#: Reads and writes one claim makes before it gives up on a claim that keeps changing under it (each round is
#: a lost takeover: another join took the claim, then lost it again).
MAX_ATTEMPTS = 5


class UUIDClaimed(Exception):
    """Another live ClusterPeer of this cluster holds the claim: `holder` is its name."""

    def __init__(self, cluster_uuid: str, holder: str) -> None:
        super().__init__(f"cluster UUID {cluster_uuid} is claimed by ClusterPeer {holder}")
        self.cluster_uuid = cluster_uuid
        self.holder = holder

    def message(self, *, own_uuid: str, side: str) -> str:
        """ClusterUUIDInUse's message (`rules.join.claimed_uuid_problem`), naming the holder."""
        problem = join_rules.claimed_uuid_problem(self.cluster_uuid, own_uuid=own_uuid,
                                                  in_use={self.cluster_uuid.lower(): self.holder}, side=side)
        assert problem is not None
        return problem


class ClaimContended(Exception):
    """The claim changed under every attempt: a transient state, tried again later."""


def claim_object(clusterpeer: dict, namespace: str, cluster_uuid: str) -> dict:
    """The claim Lease of `cluster_uuid` held by `clusterpeer` (read from the API server: it needs its uid)."""
    name = clusterpeer["metadata"]["name"]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": uuid_claim_name(cluster_uuid),
            "namespace": namespace,
            "labels": {MANAGED_BY: MANAGED_BY_VALUE, CLUSTERPEER_LABEL: label_value(name),
                       UUID_CLAIM_LABEL: cluster_uuid.lower()},
            "ownerReferences": [ownership.owner_reference(clusterpeer)],
        },
        "spec": {"holderIdentity": name},
    }


def _holder(claim: dict) -> tuple[str, str] | None:
    """(name, uid) of the ClusterPeer the claim's ownerReferences name, or None when none does."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("kind") == "ClusterPeer" and ref.get("name") and ref.get("uid"):
            return ref["name"], ref["uid"]
    return None


async def claim(kube: KubeSession, namespace: str, clusterpeer: dict, cluster_uuid: str) -> None:
    """Make `clusterpeer` the holder of `cluster_uuid`'s claim, or find it already is. Raises `UUIDClaimed` when
    another live ClusterPeer holds it, `ClaimContended` when it kept changing under every attempt."""
    name = uuid_claim_name(cluster_uuid)
    uid = clusterpeer["metadata"]["uid"]
    obj = claim_object(clusterpeer, namespace, cluster_uuid)
    for _ in range(MAX_ATTEMPTS):
        # Read first, so that a join retried with its claim held writes nothing; the create is the atomic step.
        current = await kube.get_or_none(LEASES, name, namespace)
        if current is None:
            try:
                await kube.create(LEASES, obj, namespace)
                return
            except AlreadyExists:
                continue  # another join created it meanwhile: read it
        holder = _holder(current)
        if holder is not None and holder[1] == uid:
            return
        if holder is not None:
            live = await kube.get_or_none(CLUSTERPEERS, holder[0])
            live_meta = (live or {}).get("metadata") or {}
            if live_meta.get("uid") == holder[1] and not live_meta.get("deletionTimestamp"):
                raise UUIDClaimed(cluster_uuid, holder[0])
        # Its holder is gone (or it names none): take it over. A concurrent takeover or release makes the
        # preconditions fail or finds it gone; either way read again.
        await _delete(kube, namespace, current)
    raise ClaimContended(f"the claim of cluster UUID {cluster_uuid} changed under every attempt")


async def release(kube: KubeSession, namespace: str, clusterpeer: dict, cluster_uuid: str) -> None:
    """Delete `cluster_uuid`'s claim when `clusterpeer` (by uid) holds it, with the claim's uid and resourceVersion
    as preconditions: a claim of another ClusterPeer, or one taken over meanwhile, is kept; one gone is no error."""
    name = uuid_claim_name(cluster_uuid)
    current = await kube.get_or_none(LEASES, name, namespace)
    holder = _holder(current) if current is not None else None
    if holder is None or holder[1] != ((clusterpeer.get("metadata") or {}).get("uid")):
        return
    await _delete(kube, namespace, current)


async def _delete(kube: KubeSession, namespace: str, current: dict) -> None:
    """Delete the claim as `current` (a copy read) holds it: its uid and resourceVersion are the preconditions, so
    a claim changed or made again since is kept; one gone is no error."""
    meta = current.get("metadata") or {}
    try:
        await kube.delete(LEASES, meta.get("name"), namespace, uid=meta.get("uid"),
                          resource_version=meta.get("resourceVersion"))
    except (Conflict, NotFound):
        pass
