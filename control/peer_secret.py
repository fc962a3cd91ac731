"""The peer Secret `peer-<clusterpeer>`: the one place that writes it (its keys and typed value:
`contract/peer_secret.py`; docs/internals.md).

Three writers meet on it, all through this module: this cluster's ClusterPeer reconciler (a joiner's key, the
exchanged credentials, our renewed client certificate), the join handler (the inviter's half, once it redeemed a
connection string: `replace_peer_secret`) and the peer handlers (the certificate we issued to the peer, renewed
when the peer asks). Every write carries the resourceVersion it read, so no writer loses another's change:
`update_peer_secret` reads again and re-applies its change on a conflict; `write_peer_secret` hands the conflict to
a caller that requeues; `replace_peer_secret` replaces what an unfinished exchange left. The reconciler deletes an
abandoned one (`drop_peer_secret`). `tests/control/test_writers.py` holds that no other module writes it.
"""

from __future__ import annotations

from typing import Callable

from contract.names import peer_secret_name
from contract.peer_secret import PeerCredentials
from control.apply import DELETING, READ, create_or_update
from control.kube import CLUSTERPEERS, SECRETS, Conflict, KubeSession, NotFound
from control.rules import credentials as creds

#: Reads and writes one change makes before it gives up on a Secret that keeps changing under it.
MAX_ATTEMPTS = 5


class PeeringGone(Exception):
    """The ClusterPeer or its peer Secret no longer exists (or is being deleted)."""


async def write_peer_secret(kube: KubeSession, cp: dict, namespace: str, values: PeerCredentials,
                            current: dict | None) -> dict | None:
    """The Secret as written with `values` (over `current`, the copy the pass knows), or None when a concurrent
    write or a deletion came first: the caller requeues and reads again."""
    obj = creds.peer_secret(cp, namespace, values)
    try:
        applied = await create_or_update(kube, SECRETS, obj, current=current)
    except Conflict:
        return None
    return None if applied.op == DELETING else applied.obj


async def replace_peer_secret(kube: KubeSession, cp: dict, namespace: str, values: PeerCredentials) -> None:
    """Write the Secret with exactly `values` over whatever the API holds now (read first): an inviter's half of a
    redemption it just won replaces what an earlier, unfinished exchange of this ClusterPeer left. Raises Conflict
    or NotFound when a concurrent write or a deletion came first."""
    await create_or_update(kube, SECRETS, creds.peer_secret(cp, namespace, values), current=READ)


async def drop_peer_secret(kube: KubeSession, namespace: str, name: str, secret: dict) -> None:
    """Delete the peer Secret of ClusterPeer `name` as `secret` (a copy read) holds it: a concurrent change since
    (its resourceVersion moved) keeps it, and one already gone is no error."""
    meta = secret.get("metadata") or {}
    try:
        await kube.delete(SECRETS, peer_secret_name(name), namespace, resource_version=meta.get("resourceVersion"),
                          uid=meta.get("uid"))
    except (Conflict, NotFound):
        pass


async def update_peer_secret(kube: KubeSession, namespace: str, name: str,
                             change: Callable[[PeerCredentials], PeerCredentials | None], *,
                             cached: Callable[[], tuple[dict | None, dict | None]] | None = None
                             ) -> PeerCredentials | None:
    """Read the ClusterPeer `name` and its peer Secret from the API, apply `change` to the Secret's values and write
    them with the resourceVersion read; on a conflict, read and apply again. `change` returns the new values, or
    None when nothing is to be written (it may raise to refuse). Returns the values the Secret holds afterwards, or
    None when every attempt met a concurrent write. Raises PeeringGone when the peering no longer exists.

    `cached` gives the first attempt the two objects from the informers' caches instead of two GETs (a request
    handler of the peer protocol, which a peer may call often): a change that writes nothing then costs the API
    server nothing, and a write from a copy the cache has not caught up with fails its resourceVersion
    precondition and is read again from the API."""
    for attempt in range(MAX_ATTEMPTS):
        if attempt == 0 and cached is not None:
            cp, secret = cached()
            if cp is None or secret is None:
                continue  # not in the caches (yet): the API says whether the peering is gone
        else:
            cp = await kube.get_or_none(CLUSTERPEERS, name)
            secret = await kube.get_or_none(SECRETS, peer_secret_name(name), namespace)
        if cp is None or secret is None:
            raise PeeringGone(name)
        values = PeerCredentials.from_secret(secret)
        new = change(values)
        if new is None:
            return values
        obj = creds.peer_secret(cp, namespace, new)
        try:
            applied = await create_or_update(kube, SECRETS, obj, current=secret)
        except Conflict:
            continue
        except NotFound:
            raise PeeringGone(name) from None
        if applied.op == DELETING:
            raise PeeringGone(name)
        return new
    return None
