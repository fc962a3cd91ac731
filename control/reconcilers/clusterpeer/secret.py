"""The peer Secret `peer-<clusterpeer>` as the joining side writes it: our key before the join, the exchanged
credentials after it, our renewed client certificate later (docs/internals.md lists its keys)."""

from __future__ import annotations

from control.apply import DELETING, create_or_update
from control.kube import SECRETS, Conflict, KubeSession
from control.rules import credentials as creds


async def write_peer_secret(kube: KubeSession, cp: dict, namespace: str, values: dict[str, str],
                            current: dict | None) -> dict | None:
    """The Secret as written with `values` (over `current`, the copy the pass knows), or None when a concurrent
    write or a deletion came first: the caller requeues and reads again."""
    obj = creds.peer_secret(cp, namespace, {k: v for k, v in values.items() if k in creds.KEYS})
    try:
        applied = await create_or_update(kube, SECRETS, obj, current=current)
    except Conflict:
        return None
    return None if applied.op == DELETING else applied.obj
