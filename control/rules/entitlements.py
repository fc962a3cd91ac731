"""What an established peering entitles the peer's consumers to here, derived once: the effective capabilities
(`effective`), from them and the paired projects (`projects`) the grants (`grants`).

The ClusterPeer reconciler shows the result in the status (effectiveCapabilities, grants, pairedProjectsCount, the
audiences of access and of the TokenExchangeProvider); the grants reconciler writes its Roles, bindings and
ProjectPeers. Both call `entitlements` on what they observed, so the two can never derive it differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from contract.names import peering_identity
from control.rules.capabilities import ValidatedCapability
from control.rules.effective import EffectiveResult, effective_capabilities
from control.rules.grants import Grants, desired_grants
from control.rules.projects import Pair, pair_projects, paired_namespaces, pairs_count


@dataclass(frozen=True)
class Entitlements:
    effective: EffectiveResult = field(default_factory=lambda: EffectiveResult(()))
    pairs: tuple[Pair, ...] = ()
    grants: Grants = field(default_factory=Grants)

    @property
    def capability_names(self) -> list[str]:
        """status.effectiveCapabilities."""
        return self.effective.names

    @property
    def paired_count(self) -> int:
        """status.pairedProjectsCount."""
        return pairs_count(self.pairs)


NONE = Entitlements()
"""A peering that is not established entitles to nothing."""


def entitlements(clusterpeer: dict, *, peer: dict | None,
                 local_capabilities: Mapping[str, ValidatedCapability],
                 local_projects: Mapping[str, list[str]]) -> Entitlements:
    """For an established peering: `peer` is its status.peer (the peer's last accepted offer; None until the
    first arrives). The grants name the peer's consumers by the peering's identity here (the uid of `clusterpeer`,
    `contract.names.peering_identity`), never by the UUID the peer claims. Opened capabilities are spec.capabilities."""
    opened = [c for c in (clusterpeer.get("spec") or {}).get("capabilities") or [] if isinstance(c, str)]
    effective = effective_capabilities(opened, peer.get("capabilities") if peer is not None else None,
                                       local_capabilities)
    pairs = tuple(pair_projects(local_projects, (peer or {}).get("projects")))
    grants = desired_grants(clusterpeer, peering_identity(clusterpeer), effective.effective, local_capabilities,
                            paired_namespaces(pairs))
    return Entitlements(effective, pairs, grants)
