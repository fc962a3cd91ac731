"""The ClusterPeer reconciler: one level-based pass per ClusterPeer that brings the peering to what its spec and
the peer's offer ask for, phase by phase, each phase returning a typed outcome:

1. `observe`: the caches and the cluster's facts as one value (`Observed`): our offer, the peer Secret, how far
   the credentials exchange got, the spec checked (`rules.spec`).
2. `invite` (an Invite, before anyone joined): status.invite, a new connection string when due (`InviteOutcome`).
   `join` (a Join, before the exchange is complete): `POST /v1/join` to the inviter and the peer Secret
   (`JoinOutcome`).
3. `sync` (once established): renew our client certificate, deliver ours to the inviter, pull the peer's offer
   (`SyncOutcome`); what the peering entitles to follows (`rules.entitlements`).
4. `provider`: the peer's TokenExchangeProvider and TokenExchangeReady.
5. `reconciler`: the status from all of that, in one place (`rules.status.clusterpeer_status`, reasons chosen in
   `rules.conditions`), written only if it differs; then our changed offer is announced (`sync`).

The grants and ProjectPeers that follow from the status are written by `reconcilers.grants`. Nothing is written
when nothing changed, so a steady state makes no API writes. Failures of the peer never revoke: they set Ready
False with a reason and leave grants, provider and pairs as they are.
"""

from control.reconcilers.clusterpeer.observe import MAX_REQUEUE, NAME
from control.reconcilers.clusterpeer.reconciler import ClusterPeerReconciler

__all__ = ["MAX_REQUEUE", "NAME", "ClusterPeerReconciler"]
