"""The Event writer (control/events.py) against a lab cluster's API server, the emulator and a real
kube-apiserver: the Events validate, `kubectl describe` shows them, repeats become a series, the rate limits hold,
a replica that does not lead writes none, and nothing that looks like a credential is ever written."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
import pytest_asyncio

from control import events as ev
from control.kube import EVENTS, KubeSession
from control.rules.events import EventSpec
from lab.testing import KUBECTL, apiserver_backends, lab_clusters
from tests.control.conftest import FakeClock

pytestmark = pytest.mark.asyncio(loop_scope="module")

API_VERSION = "peering.deckhouse.io/v1alpha1"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def cluster(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["x"], peering_command=None,
                            apiserver=request.param) as lab:
        x = lab["x"]
        async with await KubeSession.connect(str(x.path("kubeconfig"))) as kube:
            yield x, kube


def _peer(x, name: str) -> dict:
    return x.api.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": name},
                         "spec": {"type": "Invite"}})


def _recorder(kube, clock, **kw) -> ev.EventRecorder:
    return ev.EventRecorder(kube, identity="peering-0", leading=lambda: True, clock=clock, **kw)


async def _events_of(kube, obj: dict, namespace: str = "default") -> list[dict]:
    uid = obj["metadata"]["uid"]
    listed = await kube.list(EVENTS, namespace)
    return [e for e in listed["items"] if (e.get("regarding") or {}).get("uid") == uid]


def _kubectl(x, *args: str) -> str:
    done = subprocess.run([KUBECTL, "--kubeconfig", str(x.path("kubeconfig")), *args], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_an_event_of_a_clusterpeer_validates_and_kubectl_describe_shows_it(cluster):
    x, kube = cluster
    cp = _peer(x, "described")
    rec = _recorder(kube, FakeClock())
    await rec.emit(cp, EventSpec("Warning", "PeerUnreachable", "Sync", "the peer's entrance did not answer"))
    [event] = await _events_of(kube, cp)
    assert event["metadata"]["namespace"] == "default"  # a cluster-scoped object's Events, as client-go's
    assert event["regarding"]["kind"] == "ClusterPeer" and event["regarding"]["name"] == "described"
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "PeerUnreachable", "Sync")
    assert event["reportingController"] == "peering.deckhouse.io/controller"
    assert event["reportingInstance"] == "peering-0"
    text = await asyncio.to_thread(_kubectl, x, "describe", "clusterpeer", "described")
    events = text.split("Events:", 1)[1]
    assert "PeerUnreachable" in events and "the peer's entrance did not answer" in events
    assert "peering.deckhouse.io/controller" in events


async def test_repeats_become_a_series_written_at_most_every_thirty_seconds(cluster):
    x, kube = cluster
    cp = _peer(x, "flapping")
    clock = FakeClock()
    rec = _recorder(kube, clock)
    spec = EventSpec("Warning", "PeerUnreachable", "Sync", "did not answer")
    await rec.emit(cp, spec)
    clock.advance(5)
    await rec.emit(cp, spec)          # counted, not written yet
    clock.advance(30)
    await rec.emit(cp, spec)          # the series, count 3
    [event] = await _events_of(kube, cp)
    assert event["series"]["count"] == 3 and event["series"]["lastObservedTime"]
    # Past the aggregation window the same Event is recorded anew.
    clock.advance(600)
    await rec.emit(cp, spec)
    assert len(await _events_of(kube, cp)) == 2


async def test_the_per_object_limit_drops_what_goes_beyond_its_burst(cluster):
    x, kube = cluster
    cp, other = _peer(x, "noisy"), _peer(x, "quiet")
    clock = FakeClock()
    rec = _recorder(kube, clock, per_object_burst=3, per_object_refill=60.0)
    before = ev.EVENTS_WRITTEN.labels("ClusterPeer", "Joining", "dropped")._value.get()
    for i in range(5):
        await rec.emit(cp, EventSpec("Normal", "Joining", "Join", f"attempt {i}"))
    assert len(await _events_of(kube, cp)) == 3
    assert ev.EVENTS_WRITTEN.labels("ClusterPeer", "Joining", "dropped")._value.get() == before + 2
    await rec.emit(other, EventSpec("Normal", "Joining", "Join", "another object has its own bucket"))
    assert len(await _events_of(kube, other)) == 1
    clock.advance(61)  # one token back
    await rec.emit(cp, EventSpec("Normal", "Joining", "Join", "after a minute"))
    assert len(await _events_of(kube, cp)) == 4


async def test_a_replica_that_does_not_lead_writes_nothing(cluster):
    x, kube = cluster
    cp = _peer(x, "follower")
    rec = ev.EventRecorder(kube, identity="peering-1", leading=lambda: False, clock=FakeClock())
    before = kube.writes
    await rec.emit(cp, EventSpec("Normal", "PeeringReady", "Sync", "works"))
    assert kube.writes == before and await _events_of(kube, cp) == []


async def test_no_credential_is_ever_written_and_the_note_fits_the_api(cluster):
    x, kube = cluster
    cp = _peer(x, "careful")
    rec = _recorder(kube, FakeClock())
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    pem = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI\n-----END EC PRIVATE KEY-----"
    await rec.emit(cp, EventSpec("Warning", "InvalidSpec", "Reconcile",
                                 f"string d8peer1.eyJ1IjoiYSJ9 token {jwt} key {pem} " + "x" * 2000))
    [event] = await _events_of(kube, cp)
    note = event["note"]
    assert "d8peer1.eyJ" not in note and jwt not in note and "MHcCAQEEI" not in note
    assert "<connection string>" in note and "<token>" in note and "<PEM>" in note
    assert len(note.encode()) <= 1024


async def test_an_event_of_a_namespaced_object_lives_in_its_namespace(cluster):
    x, kube = cluster
    secret = x.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "evt", "namespace": "d8-peering"},
                           "type": "Opaque", "data": {}})
    await _recorder(kube, FakeClock()).emit(secret, EventSpec("Normal", "CertificateRenewed", "Renew", "renewed"))
    [event] = await _events_of(kube, secret, "d8-peering")
    assert event["regarding"]["namespace"] == "d8-peering"


async def test_an_api_error_never_fails_the_caller(cluster):
    x, kube = cluster
    rec = _recorder(kube, FakeClock())
    before = ev.EVENTS_WRITTEN.labels("ClusterPeer", "PeeringReady", "failed")._value.get()
    # A namespace that cannot exist: the API refuses, the caller goes on.
    ghost = {"apiVersion": API_VERSION, "kind": "ClusterPeer",
             "metadata": {"name": "ghost", "uid": "0000", "namespace": "no-such-namespace"}}
    await rec.emit(ghost, EventSpec("Normal", "PeeringReady", "Sync", "works"))
    assert ev.EVENTS_WRITTEN.labels("ClusterPeer", "PeeringReady", "failed")._value.get() == before + 1
