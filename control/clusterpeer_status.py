"""A ClusterPeer's status: the one place that writes it.

Two writers meet on it, both through this module: the ClusterPeer reconciler writes the whole status it computed
in its pass (`rules.status.clusterpeer_status`), and the join handler writes `status.invite` alone when it redeems
a connection string (marks it used with its redeemer, or abandoned: `rules.invite`), since that write is what
makes exactly one of concurrent redemptions win. Each write carries the resourceVersion of the object it was
computed from, so neither loses the other's change: a Conflict goes back to the caller, which reads again.
`tests/control/test_writers.py` holds that no other module writes it.
"""

from __future__ import annotations

from control.kube import CLUSTERPEERS, KubeSession


async def write_status(kube: KubeSession, cp: dict, status: dict) -> dict:
    """Replace the status of `cp` (as read, with its resourceVersion) by `status`; raises Conflict or NotFound."""
    return await kube.update_status(CLUSTERPEERS, {**cp, "status": status})


async def write_invite(kube: KubeSession, cp: dict, invite: dict) -> dict:
    """Replace `status.invite` of `cp` (as read), keeping the rest of its status; raises Conflict or NotFound."""
    return await write_status(kube, cp, {**((cp.get("status") or {})), "invite": invite})
