"""Leader election between runtimes sharing one emulated API server: acquisition, handover on release,
takeover after expiry, and losing the Lease stopping the reconcilers at once."""

from __future__ import annotations

import asyncio

from control import kube as k
from control.config import LeaseSettings
from control.lease import LeaderElector
from tests.control.conftest import NAMESPACE, eventually

FAST = dict(duration=1.0, renew_deadline=0.6, retry_period=0.05)


class Leadership:
    def __init__(self):
        self.started = 0
        self.stopped = 0
        self.running = asyncio.Event()

    async def on_started(self):
        self.started += 1
        self.running.set()

    async def on_stopped(self):
        self.stopped += 1
        self.running.clear()


def elector(kube, identity, tracker, **overrides):
    settings = LeaseSettings(identity=identity, **{**FAST, **overrides})
    return LeaderElector(kube, NAMESPACE, settings, on_started=tracker.on_started, on_stopped=tracker.on_stopped)


async def test_one_leader_then_handover_on_release(kube, api):
    server, _ = api
    a_track, b_track = Leadership(), Leadership()
    a, b = elector(kube, "a", a_track), elector(kube, "b", b_track)
    a.start()
    try:
        await eventually(lambda: a.is_leader, what="a leads")
        b.start()
        lease = server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseTransitions"] == 0
        assert lease["spec"]["leaseDurationSeconds"] == 1 and lease["spec"]["acquireTime"]
        # b keeps trying while a renews: it never leads.
        renew_time = lease["spec"]["renewTime"]
        await eventually(lambda: server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
                         ["spec"]["renewTime"] != renew_time, what="a renewal")
        assert not b.is_leader and b_track.started == 0
        await a.stop()
        assert a_track.stopped == 1 and not a.is_leader
        await eventually(lambda: b.is_leader, timeout=5, what="b takes over after the release")
        lease = server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
        await asyncio.wait_for(b_track.running.wait(), 5)
    finally:
        await a.stop()
        await b.stop()
    assert "holderIdentity" not in server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)["spec"]


async def test_a_leader_releases_the_lease_even_when_its_last_renewal_landed_unseen(kube, api):
    """A renewal cancelled by the stop may still have been applied by the API server: the leader's copy is then
    behind, its release meets a Conflict, and the Lease is read again and released, not left for a successor to
    wait out."""
    server, _ = api
    track = Leadership()
    a = elector(kube, "a", track, retry_period=60.0)  # no renewal of its own while the test writes the Lease
    a.start()
    try:
        await eventually(lambda: a.is_leader, what="a leads")
        lease = server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        lease["spec"]["renewTime"] = "2030-01-01T00:00:00.000000Z"  # a's renewal, applied, its answer lost
        server.update(lease)
    finally:
        await a.stop()
    assert "holderIdentity" not in server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)["spec"]


async def test_a_crashed_leader_is_replaced_after_the_lease_duration(kube, api):
    server, _ = api
    a_track, b_track = Leadership(), Leadership()
    a, b = elector(kube, "a", a_track), elector(kube, "b", b_track)
    a.start()
    await eventually(lambda: a.is_leader, what="a leads")
    # A crash: a stops renewing and does not release.
    await a.stop(release=False)
    b.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await eventually(lambda: b.is_leader, timeout=5, what="b takes over")
        assert loop.time() - started >= 0.9, "b must wait the lease duration before taking over"
    finally:
        await b.stop()


async def test_losing_the_lease_stops_reconciling_at_once(kube, api):
    server, _ = api
    track = Leadership()
    cancelled = asyncio.Event()

    async def long_start():
        track.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    a = LeaderElector(kube, NAMESPACE, LeaseSettings(identity="a", **FAST), on_started=long_start,
                      on_stopped=track.on_stopped)
    a.start()
    try:
        await eventually(lambda: a.is_leader and track.started == 1, what="a leads")
        lease = server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)
        lease["spec"]["holderIdentity"] = "intruder"
        server.update(lease)
        await eventually(lambda: not a.is_leader and track.stopped == 1, timeout=3,
                         what="a notices it lost the lease and stops")
        assert cancelled.is_set()
    finally:
        await a.stop()
    # It never writes itself back over a live holder, and does not release what it does not hold.
    assert server.get("coordination.k8s.io", "leases", "peering", NAMESPACE)["spec"]["holderIdentity"] == "intruder"


async def test_a_leader_that_cannot_renew_steps_down_after_the_renew_deadline(tmp_path):
    from tests.control.conftest import start_api

    server, kubeconfig = await start_api(tmp_path)
    session = await k.KubeSession.connect(str(kubeconfig))
    track = Leadership()
    a = elector(session, "a", track)
    try:
        a.start()
        await eventually(lambda: a.is_leader, what="a leads")
        await server.stop()  # the API server goes away: renewals fail
        await eventually(lambda: not a.is_leader and track.stopped == 1, timeout=5, what="a steps down")
    finally:
        await a.stop(release=False)
        await session.close()
        await server.stop()


class SlowUpdates:
    """The session's calls as they are, but every update answers only after `delay`: an API server slowed by a
    queue of other writes."""

    def __init__(self, kube, delay: float) -> None:
        self.kube = kube
        self.delay = delay
        self.updates = 0

    async def get_or_none(self, *args, **kwargs):
        return await self.kube.get_or_none(*args, **kwargs)

    async def create(self, *args, **kwargs):
        return await self.kube.create(*args, **kwargs)

    async def update(self, *args, **kwargs):
        await asyncio.sleep(self.delay)  # the latency being emulated, not a wait for a condition
        result = await self.kube.update(*args, **kwargs)
        self.updates += 1
        return result


async def test_a_leader_keeps_the_lease_while_renewals_are_slow_but_inside_the_renew_deadline(kube, api):
    # Each renewal takes 2/3 of the renew deadline: longer than half of it (where an attempt used to be cut off
    # and sent again), shorter than the deadline itself. On a scale where the remaining third (1 s) is more than
    # the update itself takes on a loaded machine: the property does not depend on the scale, the margin does.
    scale = dict(duration=4.0, renew_deadline=3.0)
    slow = SlowUpdates(kube, delay=scale["renew_deadline"] * 2 / 3)
    track = Leadership()
    a = elector(slow, "a", track, **scale)
    a.start()
    try:
        await eventually(lambda: a.is_leader, what="a leads")
        await eventually(lambda: slow.updates >= 3, timeout=30, what="three slow renewals")
        assert a.is_leader and track.started == 1 and track.stopped == 0 and a.transitions == 1
    finally:
        await a.stop()


async def test_renew_deadline_must_be_shorter_than_the_duration(kube):
    import pytest

    with pytest.raises(ValueError, match="shorter than the lease duration"):
        elector(kube, "a", Leadership(), duration=1.0, renew_deadline=1.0)
