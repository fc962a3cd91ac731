"""Who is a consumer of which capability: the one rule both directions apply (DESIGN.md 7).

At the entrance the subject of a peer's verified token is checked, at the egress the user a TokenReview of a local
pod's token names; either way a capability is granted only when it is Accepted here and lists that ServiceAccount
in spec.consumers. Pure over the registry snapshot.
"""

from __future__ import annotations

from typing import Iterable

from contract.names import SA_PREFIX
from gateway.registry import Registry


def service_account(username: object) -> tuple[str, str] | None:
    """(namespace, name) of a `system:serviceaccount:<ns>:<name>` user, or None for any other user."""
    if not isinstance(username, str) or not username.startswith(SA_PREFIX):
        return None
    namespace, _, name = username[len(SA_PREFIX):].partition(":")
    return namespace, name


def consumer_capabilities(registry: Registry, names: Iterable[str], account: tuple[str, str] | None
                          ) -> frozenset[str]:
    """Those of the capabilities `names` that `account` may use: Accepted here, and listing it as a consumer."""
    if account is None:
        return frozenset()
    caps = registry.capabilities
    return frozenset(c for c in names if (cap := caps.get(c)) is not None and cap.accepted
                     and account in cap.consumers)
