"""Effective capabilities: opened here, offered by the peer, Accepted here, and of the same version on both sides.

Each capability that is not effective gets a short explanation, so a condition message can say what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from control.rules.capabilities import ValidatedCapability


@dataclass(frozen=True)
class EffectiveCapability:
    name: str
    version: str
    #: Scope here (decides the grants); sorted tuple of "cluster"/"project".
    scope: tuple[str, ...]
    #: Scope the peer announced (decides what our consumers may do there).
    peer_scope: tuple[str, ...] = ()


@dataclass(frozen=True)
class EffectiveResult:
    effective: tuple[EffectiveCapability, ...]
    #: name -> why it is not effective, for every opened name that is not.
    not_effective: Mapping[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """status.effectiveCapabilities."""
        return [c.name for c in self.effective]

    def get(self, name: str) -> EffectiveCapability | None:
        return next((c for c in self.effective if c.name == name), None)

    def summary(self) -> str:
        """One sentence about the non-effective ones, or an empty string."""
        return "; ".join(f"{n}: {why}" for n, why in sorted(self.not_effective.items()))


def _peer_index(peer_capabilities) -> dict[str, dict] | None:
    if peer_capabilities is None:
        return None
    out = {}
    for c in peer_capabilities:
        if isinstance(c, dict) and isinstance(c.get("name"), str):
            out.setdefault(c["name"], c)
    return out


def effective_capabilities(
    opened: Iterable[str] | None,
    peer_capabilities: list[dict] | None,
    local: Mapping[str, ValidatedCapability],
) -> EffectiveResult:
    """Which of spec.capabilities are effective; `peer_capabilities` is status.peer.capabilities (None: no offer)."""
    peer = _peer_index(peer_capabilities)
    effective: list[EffectiveCapability] = []
    why: dict[str, str] = {}
    for name in sorted(set(opened or [])):
        mine = local.get(name)
        theirs = peer.get(name) if peer is not None else None
        if mine is None:
            why[name] = "no PeeringCapability of this name exists here; check the name in spec.capabilities"
        elif not mine.accepted:
            # The verdict's own words: where it is granted, discovery can refuse what the Accepted condition,
            # decided without it, did not (a write on a cluster-scoped kind the policy does not know).
            why[name] = f"the PeeringCapability is not accepted here ({mine.verdict.reason}: {mine.verdict.message})"
        elif peer is None:
            why[name] = "the peer's offer has not arrived yet"
        elif theirs is None:
            why[name] = "the peer has not opened it; list it in spec.capabilities of the ClusterPeer there"
        elif str(theirs.get("version") or "") != mine.version:
            why[name] = (
                f"the versions differ: {mine.version} here, {theirs.get('version')} at the peer; "
                "update the module that declares it on one side"
            )
        else:
            peer_scope = tuple(sorted({s for s in theirs.get("scope") or [] if s in ("cluster", "project")}))
            effective.append(EffectiveCapability(name, mine.version, mine.scope, peer_scope))
    return EffectiveResult(tuple(effective), why)


def offered_capabilities(opened: Iterable[str] | None, local: Mapping[str, ValidatedCapability]) -> list[dict]:
    """The capabilities this side opens to the peer, for status.offer: opened here and Accepted here."""
    out = []
    for name in sorted(set(opened or [])):
        mine = local.get(name)
        if mine is not None and mine.accepted:
            out.append({"name": name, "version": mine.version, "scope": list(mine.scope)})
    return out
