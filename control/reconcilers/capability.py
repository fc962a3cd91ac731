"""The PeeringCapability reconciler: the Accepted condition (reason chosen by `rules.capabilities.validate`) with
observedGeneration (`rules.status.capability_status`), written only when it changes."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from control.kube import PEERINGCAPABILITIES, Conflict, NotFound
from control.rules import capabilities as cap_rules
from control.rules.capabilities import Namespaced
from control.rules import events as event_rules
from control.rules.conditions import Cond
from control.rules.status import capability_status
from control.workqueue import Result, Watch

if TYPE_CHECKING:
    from control.context import Context

NAME = "peeringcapability"


def desired_capability_status(obj: dict, now: datetime.datetime, namespaced: Namespaced | None = None) -> dict:
    """status of a PeeringCapability: Accepted from its spec and the scopes discovery gives (`namespaced`), with the
    generation it was computed for (pure)."""
    verdict = cap_rules.validate(obj.get("spec"), namespaced)
    return capability_status(obj.get("status"), generation=(obj.get("metadata") or {}).get("generation"), now=now,
                             accepted=Cond(verdict.status, verdict.reason, verdict.message))


class CapabilityReconciler:
    name = NAME

    def __init__(self, ctx: "Context") -> None:
        self.kube = ctx.kube
        self.clock = ctx.clock
        self.events = ctx.events
        self.discovery = ctx.discovery
        self.informer = ctx.informers.get(PEERINGCAPABILITIES)
        self.watches = (Watch(PEERINGCAPABILITIES),)

    async def reconcile(self, key: str) -> Result:
        obj = self.informer.get(key)
        if obj is None:
            return Result()
        # A kind the policy's tables do not know is judged by its scope in discovery (a cluster-scoped one is
        # refused for writes), the same discovery the grants are split by: Accepted says what the grants do.
        await self.discovery.refresh()
        status = desired_capability_status(obj, self.clock.now(), self.discovery.namespaced)
        # Discovery changes without an event of ours (a CRD installed): judged again when it may have.
        again = Result(requeue_after=self.discovery.ttl)
        if status == (obj.get("status") or {}):
            return again
        try:
            await self.kube.update_status(PEERINGCAPABILITIES, {**obj, "status": status})
        except Conflict:
            return Result(requeue=True)
        except NotFound:
            return Result()
        await self.events.emit_all(obj, event_rules.capability_events(obj.get("status"), status))
        return again
