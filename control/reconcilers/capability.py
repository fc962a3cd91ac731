"""The PeeringCapability reconciler: the Accepted condition (reason chosen by `rules.capabilities.validate`) with
observedGeneration, written only when it changes."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from control.kube import PEERINGCAPABILITIES, Conflict, NotFound
from control.rules import capabilities as cap_rules
from control.rules.conditions import ACCEPTED, Cond, set_condition
from control.workqueue import Result, Watch

if TYPE_CHECKING:
    from control.context import Context


def desired_capability_status(obj: dict, now: datetime.datetime) -> dict:
    """status of a PeeringCapability: Accepted from its spec, with the generation it was computed for (pure)."""
    verdict = cap_rules.validate(obj.get("spec"))
    generation = (obj.get("metadata") or {}).get("generation")
    status = dict(obj.get("status") or {})
    status["conditions"] = set_condition(status.get("conditions"), ACCEPTED,
                                         Cond(verdict.status, verdict.reason, verdict.message),
                                         generation=generation, now=now)
    if generation is not None:
        status["observedGeneration"] = generation
    return status


class CapabilityReconciler:
    name = "peeringcapability"

    def __init__(self, ctx: "Context") -> None:
        self.kube = ctx.kube
        self.clock = ctx.clock
        self.informer = ctx.informers.get(PEERINGCAPABILITIES)
        self.watches = (Watch(PEERINGCAPABILITIES),)

    async def reconcile(self, key: str) -> Result:
        obj = self.informer.get(key)
        if obj is None:
            return Result()
        status = desired_capability_status(obj, self.clock.now())
        if status == (obj.get("status") or {}):
            return Result()
        try:
            await self.kube.update_status(PEERINGCAPABILITIES, {**obj, "status": status})
        except Conflict:
            return Result(requeue=True)
        except NotFound:
            pass
        return Result()
