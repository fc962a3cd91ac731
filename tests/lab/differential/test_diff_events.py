"""Events as the control loop records them (events.k8s.io/v1, control/events.py) and as `kubectl describe` reads
them back (core v1 Events by involvedObject), the same on the emulator and on the real kube-apiserver."""

from __future__ import annotations

import pytest
from differential_support import Backend

pytestmark = pytest.mark.asyncio(loop_scope="module")

EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"
CORE_EVENTS = "/api/v1/namespaces/default/events"
CP = "/apis/peering.deckhouse.io/v1alpha1/clusterpeers"
# Times the server or the writer chose: compared by form.
VOLATILE = ("eventTime", "lastObservedTime", "firstTimestamp", "lastTimestamp")


def event(name: str, regarding: dict, **over) -> dict:
    body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"app.kubernetes.io/managed-by": "peering"}},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "peering.deckhouse.io/controller",
            "reportingInstance": "peering-0", "action": "Reconcile", "reason": "Invited", "type": "Normal",
            "note": "the connection string is issued", "regarding": regarding}
    body.update(over)
    return body


async def test_an_event_written_aggregated_and_read_back(pair):
    async def case(b: Backend):
        peer = await b.call("POST", CP, body={"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer",
                                              "metadata": {"name": "ev-peer"}, "spec": {"type": "Invite"}})
        assert peer.status == 201, peer
        ref = {"apiVersion": "peering.deckhouse.io/v1alpha1", "kind": "ClusterPeer", "name": "ev-peer",
               "uid": peer.body["metadata"]["uid"]}
        s = {}
        s["create"] = await b.call("POST", EVENTS, body=event("ev-peer.1", ref))
        s["series"] = await b.call("PATCH", f"{EVENTS}/ev-peer.1", content_type="application/merge-patch+json",
                                   body={"series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:05.000000Z"}})
        s["as kubectl describe reads it"] = await b.call("GET", CORE_EVENTS, params={
            "fieldSelector": f"involvedObject.name=ev-peer,involvedObject.namespace=,involvedObject.kind=ClusterPeer,"
                             f"involvedObject.uid={ref['uid']}"})
        s["by label"] = await b.call("GET", EVENTS, params={"labelSelector": "app.kubernetes.io/managed-by=peering"})
        s["without reportingController"] = await b.call("POST", EVENTS, body=event(
            "ev-peer.2", ref, reportingController=None))
        s["a type of its own"] = await b.call("POST", EVENTS, body=event("ev-peer.3", ref, type="Odd"))
        s["without eventTime"] = await b.call("POST", EVENTS, body=event("ev-peer.4", ref, eventTime=None))
        s["a note too long"] = await b.call("POST", EVENTS, body=event("ev-peer.5", ref, note="n" * 1025))
        for name in ("ev-peer.1", "ev-peer.2", "ev-peer.3", "ev-peer.4", "ev-peer.5"):
            await b.call("DELETE", f"{EVENTS}/{name}")
        await b.call("DELETE", f"{CP}/ev-peer")
        return s

    await pair.run(case, volatile=VOLATILE)
