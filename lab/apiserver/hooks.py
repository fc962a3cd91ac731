"""After-write hooks: a test's callback runs when a write it names has landed, before its answer leaves.

The crash tests of the join (tests/e2e/test_join_crashes.py) stop the peering process right after a given write:
the write is stored and seen by watchers, the writer never reads the answer. `WriteHooks.after(...)` registers
one callback for the nth write that matches (verbs, resource, name, and optionally who wrote and a predicate on the
object as written); `ApiServer` calls
`WriteHooks.landed` for every create, update, patch or delete over HTTP that succeeded (dry runs left out).
Writes made in-process (`ApiServer.create`...) or by the API server's own controllers are not HTTP writes and are
not seen. A callback that raises is logged and does not change the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

log = logging.getLogger("lab.apiserver.hooks")

#: The verbs of RequestInfo that write.
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Write:
    """A write that landed: `verb` as kube-apiserver names it ("update" for PUT, "patch"...), `resource` the plural
    with its subresource ("clusterpeers/status"), the object's namespace and name, the user who wrote it, and the
    object as the answer carries it (None when the answer holds none)."""

    verb: str
    resource: str
    namespace: str | None
    name: str
    user: str
    obj: dict | None = None


@dataclass
class _Hook:
    verbs: frozenset[str]
    resource: str
    name: str
    nth: int
    callback: Callable[[Write], None]
    user: str | None
    when: Callable[[Write], bool] | None
    seen: int = 0
    fired: bool = False

    def matches(self, w: Write) -> bool:
        return (w.verb in self.verbs and w.resource == self.resource and w.name == self.name
                and (self.user is None or w.user == self.user) and (self.when is None or bool(self.when(w))))


@dataclass
class WriteHooks:
    hooks: list[_Hook] = field(default_factory=list)

    def after(self, verb: str | Iterable[str], resource: str, name: str, callback: Callable[[Write], None], *,
              nth: int = 1, user: str | None = None, when: Callable[[Write], bool] | None = None) -> "_Hook":
        """Call `callback(write)` once, right after the `nth` write (from 1) of `verb` (one, or any of several) on
        `resource` (plural, with "/status" for the status subresource) named `name`, by `user` and passing `when`
        when given. Returns the hook: `fired` says whether it ran."""
        verbs = frozenset({verb} if isinstance(verb, str) else verb)
        if nth < 1:
            raise ValueError(f"nth counts writes from 1, got {nth}")
        if not verbs or not verbs <= WRITE_VERBS:
            raise ValueError(f"verb {verb!r} does not write; use any of {', '.join(sorted(WRITE_VERBS))}")
        hook = _Hook(verbs, resource, name, nth, callback, user, when)
        self.hooks.append(hook)
        return hook

    def clear(self) -> None:
        self.hooks.clear()

    def landed(self, write: Write) -> None:
        for hook in list(self.hooks):
            if hook.fired or not hook.matches(write):
                continue
            hook.seen += 1
            if hook.seen == hook.nth:
                hook.fired = True
                try:
                    hook.callback(write)
                except Exception:  # a test's callback must not turn a stored write into a failed answer
                    log.exception("after-write hook for %s %s %s failed", write.verb, write.resource, write.name)
