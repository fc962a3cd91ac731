"""Leader election with a coordination.k8s.io/v1 Lease in the module namespace.

Every replica keeps its informers and the gateway's registry; only the holder of the Lease runs the reconcilers.
The rules are client-go's: a candidate takes the Lease when it is free (no holder) or when its record has not
changed for leaseDurationSeconds as measured on the candidate's own clock (so clock skew between replicas does not
matter); every write carries the resourceVersion read just before, so of two candidates exactly one wins; the
leader renews every retry period and stops reconciling at once when it sees another holder or has not managed to
renew within the renew deadline; on a clean stop it releases the Lease so that a successor need not wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import random
import time
from typing import Awaitable, Callable

from contract.names import MANAGED_BY, MANAGED_BY_VALUE
from control.apply import create_or_update
from control.config import LeaseSettings
from control.kube import LEASES, Conflict, KubeSession

log = logging.getLogger("peering.control.lease")


def micro_time(now: datetime.datetime) -> str:
    """A meta/v1 MicroTime."""
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a candidate knows of the Lease: its record and when (on the local monotonic clock) it last changed."""

    resource_version: str
    holder: str
    duration: float
    transitions: int
    observed_at: float


def observe(lease: dict, previous: Observation | None, now: float) -> Observation:
    """Update the observation with a freshly read Lease; the clock restarts only when the record changed."""
    spec = lease.get("spec") or {}
    rv = (lease.get("metadata") or {}).get("resourceVersion", "")
    changed = previous is None or previous.resource_version != rv
    return Observation(resource_version=rv, holder=spec.get("holderIdentity") or "",
                       duration=float(spec.get("leaseDurationSeconds") or 0),
                       transitions=int(spec.get("leaseTransitions") or 0),
                       observed_at=now if changed else previous.observed_at)


def may_take(obs: Observation, identity: str, now: float) -> bool:
    """Whether `identity` may write itself as holder: it holds it already, nobody does, or the holder expired."""
    return obs.holder in ("", identity) or now - obs.observed_at > obs.duration


def desired_spec(obs: Observation | None, identity: str, duration: float, now: datetime.datetime,
                 previous_spec: dict | None) -> dict:
    """The Lease spec a successful acquire or renew writes."""
    spec = dict(previous_spec or {})
    stamp = micro_time(now)
    if obs is None or obs.holder != identity:
        spec["acquireTime"] = stamp
        # Like client-go: any change of holder (a takeover, or taking a released Lease) is a transition.
        spec["leaseTransitions"] = obs.transitions + 1 if obs is not None else 0
    spec["holderIdentity"] = identity
    spec["leaseDurationSeconds"] = max(1, int(round(duration)))
    spec["renewTime"] = stamp
    return spec


class LeaderElector:
    """Runs the election; `on_started` runs (as an owned task) when leadership is gained, `on_stopped` when lost."""

    def __init__(self, kube: KubeSession, namespace: str, settings: LeaseSettings, *,
                 on_started: Callable[[], Awaitable[None]], on_stopped: Callable[[], Awaitable[None]],
                 wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc),
                 ) -> None:
        if settings.renew_deadline >= settings.duration:
            raise ValueError(f"lease renew deadline ({settings.renew_deadline}s) must be shorter than the lease "
                             f"duration ({settings.duration}s), or two replicas could both reconcile")
        self.kube = kube
        self.namespace = namespace
        self.settings = settings
        self.identity = settings.identity
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._wall = wall_clock
        self._obs: Observation | None = None
        self._lease: dict | None = None
        self._last_renew = 0.0
        self.is_leader = False
        self.transitions = 0
        self.changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._started_task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"lease-{self.settings.name}")

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; a leader stops its reconcilers and, with `release`, frees the Lease for a successor."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        was_leader = self.is_leader
        await self._lose("stopping")
        if was_leader and release:
            await self._release()

    async def _run(self) -> None:
        period = self.settings.retry_period
        while True:
            try:
                # A hung API server must not keep a leader from noticing that its renew deadline passed.
                # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that races with
                # the inner call finishing, and this task would then never stop.)
                async with asyncio.timeout(self._attempt_timeout(time.monotonic())):
                    state = await self._try()
            except TimeoutError:
                log.warning("lease attempt timed out", extra={"lease": self.settings.name})
                state = "error"
            now = time.monotonic()
            if state == "held":
                self._last_renew = now
                if not self.is_leader:
                    self._gain()
            elif self.is_leader:
                if state == "other":
                    await self._lose(f"the Lease is now held by {self._obs.holder if self._obs else 'another'}")
                elif now - self._last_renew > self.settings.renew_deadline:
                    await self._lose(f"could not renew the Lease for {self.settings.renew_deadline}s")
            # Jitter keeps candidates that started together from colliding on every attempt.
            delay = period if self.is_leader else period * random.uniform(1.0, 1.2)
            await asyncio.sleep(delay)

    def _attempt_timeout(self, now: float) -> float:
        """How long one attempt may take. A leader lets a renewal run until its renew deadline: an API server that
        is slow under load (writes queued before the renewal) still renews in time, where cutting the request
        short and sending it again would put it at the back of the same queue and lose a Lease that was never in
        danger. A candidate has nothing to keep and tries again sooner."""
        period = self.settings.retry_period
        if self.is_leader:
            return max(period, self.settings.renew_deadline - (now - self._last_renew))
        return max(period, self.settings.renew_deadline / 2)

    async def _try(self) -> str:
        """One acquire-or-renew attempt: "held" (we hold it now), "other" (a live holder), "error"."""
        name, ns = self.settings.name, self.namespace
        try:
            lease = await self.kube.get_or_none(LEASES, name, ns)
            now = time.monotonic()
            if lease is None:
                self._obs = None
            else:
                self._obs = observe(lease, self._obs, now)
                if not may_take(self._obs, self.identity, now):
                    return "other"
            spec = desired_spec(self._obs, self.identity, self.settings.duration, self._wall(),
                                (lease or {}).get("spec"))
            # Created, or written with the resourceVersion just read: of two candidates exactly one wins.
            applied = await create_or_update(self.kube, LEASES, {
                "metadata": {"name": name, "namespace": ns, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
                "spec": spec}, current=lease)
            self._lease = applied.obj
            self._obs = observe(self._lease, self._obs, time.monotonic())
            return "held"
        except asyncio.CancelledError:
            raise
        except Conflict:
            # Someone else wrote between our read and our write; the next read tells who.
            return "error"
        except Exception as exc:  # the API server down, a 5xx, a refused write: try again next period
            log.warning("lease attempt failed", extra={"lease": name, "error": f"{type(exc).__name__}: {exc}"})
            return "error"

    def _gain(self) -> None:
        self.is_leader = True
        self.transitions += 1
        self.changed.set()
        log.info("became leader", extra={"lease": self.settings.name, "identity": self.identity})
        self._started_task = asyncio.create_task(self._on_started(), name="lease-on-started")

    async def _lose(self, why: str) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        self.transitions += 1
        self.changed.set()
        log.warning("stopped leading", extra={"lease": self.settings.name, "identity": self.identity,
                                              "reason": why})
        started, self._started_task = self._started_task, None
        if started is not None and not started.done():
            started.cancel()
        if started is not None:
            await asyncio.gather(started, return_exceptions=True)
        await self._on_stopped()

    async def _release(self) -> None:
        """Free the Lease we hold for a successor. The copy we last wrote may be behind the stored one: a renewal
        cancelled by the stop may still have been applied by the API server. On a Conflict the Lease is read again
        and released if we still hold it; not fatal when it cannot be (the successor waits out the duration)."""
        lease = self._lease
        for _ in range(3):
            if lease is None:
                return
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.pop("holderIdentity", None)
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = micro_time(self._wall())
            try:
                await self.kube.update(LEASES, {**lease, "spec": spec})
                log.info("released the lease", extra={"lease": self.settings.name})
                return
            except Conflict:
                try:
                    lease = await self.kube.get_or_none(LEASES, self.settings.name, self.namespace)
                except Exception as exc:
                    self._not_released(exc)
                    return
            except Exception as exc:
                self._not_released(exc)
                return
        log.warning("could not release the lease: it kept changing", extra={"lease": self.settings.name})

    def _not_released(self, exc: BaseException) -> None:
        # Not fatal: the successor takes over once the duration has passed.
        log.warning("could not release the lease", extra={"lease": self.settings.name,
                                                          "error": f"{type(exc).__name__}: {exc}"})

