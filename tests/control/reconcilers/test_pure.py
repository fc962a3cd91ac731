"""Table tests of the plain functions of the reconcilers: status in one place, sync failure reasons, the provider
object, owner mapping, the Accepted status of a capability, and the sync schedule."""

from __future__ import annotations

import datetime

import pytest

from control.peerclient import Answer, _refused_cert
from control.reconcilers.capability import desired_capability_status
from control.reconcilers.clusterpeer.sync import failure as sync_failure
from control.reconcilers.memory import Memory, PeerMemory
from control.rules import conditions as cond
from control.rules.ownership import owner_names
from control.rules.status import KEEP, clusterpeer_status

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
T1 = T0 + datetime.timedelta(minutes=5)
CP = {"metadata": {"name": "to-b", "uid": "u-1", "generation": 3}, "spec": {"type": "Join"}}


@pytest.mark.parametrize("answer, reason, says", [
    (Answer(None, "connection refused"), cond.PEER_UNREACHABLE, "did not answer (connection refused)"),
    (Answer(None, "TLS failed", refused_certificate=True), cond.PEER_REFUSED_CERTIFICATE, ""),
    (Answer(403, {"reason": "PeerUnknown", "message": "no live peering"}), cond.PEER_REFUSED_CERTIFICATE, ""),
    (Answer(503, {"reason": "NotReady", "message": "retry later"}), cond.PEER_UNREACHABLE, "HTTP 503 (NotReady"),
    (Answer(500, "oops"), cond.PEER_UNREACHABLE, "HTTP 500"),
])
def test_sync_failure(answer, reason, says):
    got_reason, message = sync_failure(answer)
    assert got_reason == reason and says in message
    if reason == cond.PEER_UNREACHABLE:
        assert "stays" in message


@pytest.mark.parametrize("text, refused", [
    ("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca", True),
    ("[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate", True),
    ("[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert", True),
    ("Connection reset by peer", False),
    ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", False),
])
def test_refused_certificate_detection(text, refused):
    assert _refused_cert(Exception(text)) is refused


def _status(cp, now, **kw):
    """The status as the ClusterPeer reconciler computes it from what a pass observed."""
    args = dict(state=cond.PeeringState("Join", "complete", has_peer_offer=True), invite=None,
                offer={"projects": []}, peer={"alias": "to-a"}, effective=["c"], grants=[], access=None, paired=0,
                token_exchange=cond.Cond("True", "ProviderReady", "ok"), selfcheck=None)
    args.update(kw)
    selfcheck = args["selfcheck"]
    return clusterpeer_status(
        cp.get("status"), generation=cp["metadata"].get("generation"), now=now,
        readiness=cond.readiness(args["state"], now), token_exchange=args["token_exchange"],
        client_cert=selfcheck[0] if selfcheck else KEEP, server_cert=selfcheck[1] if selfcheck else KEEP,
        invite=args["invite"], offer=args["offer"], peer=args["peer"], effectiveCapabilities=args["effective"],
        grants=args["grants"], access=args["access"], pairedProjectsCount=args["paired"])


def test_status_is_stable_and_keeps_transition_times():
    first = _status(CP, T0)
    assert first["phase"] == "Active" and first["observedGeneration"] == 3
    ready = cond.get_condition(first["conditions"], "Ready")
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == ("True", "PeeringReady",
                                                                                "2026-01-01T00:00:00Z")
    # The same world later: the same status, so no write.
    again = _status({**CP, "status": first}, T1)
    assert again == first
    # A change of status moves lastTransitionTime of that condition only.
    failed = _status({**CP, "status": first}, T1, state=cond.PeeringState(
        "Join", "complete", has_peer_offer=True, sync_error=(cond.PEER_UNREACHABLE, "down")))
    ready = cond.get_condition(failed["conditions"], "Ready")
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == ("False", "PeerUnreachable",
                                                                                "2026-01-01T00:05:00Z")
    te = cond.get_condition(failed["conditions"], "TokenExchangeReady")
    assert te["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert failed["phase"] == "Active"


def test_status_without_token_exchange_drops_the_condition_and_optional_parts():
    first = _status(CP, T0)
    pending = _status({**CP, "status": first}, T1, state=cond.PeeringState("Join"), token_exchange=None,
                      peer=None, selfcheck=(cond.Cond("True", "ClientCertRequired", "m"),
                                            cond.Cond("True", "PeeringRootCert", "m")))
    types = [c["type"] for c in pending["conditions"]]
    assert "TokenExchangeReady" not in types and {"ClientCertEnforced", "ServerCertOurs"} <= set(types)
    assert "peer" not in pending and "access" not in pending and pending["phase"] == "Pending"


@pytest.mark.parametrize("refs, names", [
    ([], []),
    ([{"kind": "ClusterPeer", "name": "a"}], ["a"]),
    ([{"kind": "Deployment", "name": "x"}, {"kind": "ClusterPeer", "name": "b"}], ["b"]),
    ([{"kind": "ClusterPeer"}], []),
])
def test_owner_names(refs, names):
    assert owner_names({"metadata": {"ownerReferences": refs}}) == names


def test_capability_status_accepts_and_refuses_with_generation():
    good = {"metadata": {"generation": 2}, "spec": {
        "version": "v1", "consumers": [{"kind": "ServiceAccount", "namespace": "n", "name": "s"}],
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}}
    status = desired_capability_status(good, T0)
    accepted = cond.get_condition(status["conditions"], "Accepted")
    assert (accepted["status"], accepted["reason"], accepted["observedGeneration"]) == ("True", "Accepted", 2)
    assert status["observedGeneration"] == 2
    assert desired_capability_status({**good, "status": status}, T1) == status
    bad = {**good, "spec": {**good["spec"], "rules": [{"apiGroups": [""], "resources": ["secrets"],
                                                        "verbs": ["get"]}]}}
    refused = cond.get_condition(desired_capability_status({**bad, "status": status}, T1)["conditions"], "Accepted")
    assert refused["status"] == "False" and refused["reason"] != "Accepted"
    assert refused["lastTransitionTime"] == "2026-01-01T00:05:00Z"


def test_a_write_on_an_unknown_kind_that_discovery_says_is_cluster_scoped_is_not_accepted():
    """Accepted judges an unknown kind by the same discovery the grants are split by: the grants would refuse a
    cluster-scoped write, so Accepted says so (it said True before, and the grants then refused it)."""
    spec = {"version": "v1", "consumers": [{"kind": "ServiceAccount", "namespace": "n", "name": "s"}],
            "rules": [{"apiGroups": ["example.org"], "resources": ["widgets"], "verbs": ["get", "patch"]}]}
    obj = {"metadata": {"generation": 1}, "spec": spec}
    scoped = {True: "True", False: "False"}
    for namespaced, verdict in scoped.items():
        status = desired_capability_status(obj, T0, lambda group, resource, n=namespaced: n)
        assert cond.get_condition(status["conditions"], "Accepted")["status"] == verdict
    # Reads of it stay accepted.
    reads = {**obj, "spec": {**spec, "rules": [{**spec["rules"][0], "verbs": ["get", "list"]}]}}
    status = desired_capability_status(reads, T0, lambda group, resource: False)
    assert cond.get_condition(status["conditions"], "Accepted")["status"] == "True"


def test_memory_schedule():
    memory = Memory(sync_interval=30.0, jitter=0.2)
    assert [memory.retry_after(n) for n in (1, 2, 3, 10)] == [0.5, 1.0, 2.0, 30.0]
    import time

    for _ in range(50):
        delay = memory.next_pull() - time.monotonic()
        assert 23.9 <= delay <= 36.1
    memory.keep("x", PeerMemory(pull_at=1e12, sync_failures=40, sync_error=("PeerUnreachable", "down")))
    assert memory.recall("x") == memory.get("x") and memory.get("x").pull_at == 1e12
    memory.pull_now("x")
    # The peer called: the next pass pulls now, and a failure then backs off from the shortest delay, not from the
    # outage's; what is kept is the pass's to write.
    assert memory.get("x").pull_at == 1e12
    recalled = memory.recall("x")
    assert (recalled.pull_at, recalled.sync_failures, recalled.sync_error) == (0.0, 0, ("PeerUnreachable", "down"))
    assert memory.recall("x").pull_at == 1e12  # asked once, taken once
    memory.forget("x")
    assert memory.get("x") == PeerMemory() and not memory.known("x")


def test_a_failed_announcement_is_retried_with_backoff_until_the_peers_pulls_take_over():
    import time

    memory = Memory(sync_interval=4.0)
    mem = memory.get("peer")
    old, new = {"projects": ["shop"]}, {"projects": ["shop", "shop-eu"]}
    mem = memory.announced(mem, old, True)
    assert (mem.notified_offer, mem.notify_at) == (old, 0.0)
    # The peer has not admitted us yet: the new offer stays to announce, after 0.25, 0.5, 1 and 2 s.
    waits = []
    for _ in range(4):
        before = time.monotonic()
        mem = memory.announced(mem, new, False)
        assert mem.notified_offer == old
        waits.append(mem.notify_at - before)
    assert waits == pytest.approx([0.25, 0.5, 1.0, 2.0], abs=0.05)
    # The next backoff would reach the sync interval: the peer's own pulls fetch it from here.
    mem = memory.announced(mem, new, False)
    assert (mem.notified_offer, mem.notify_failures, mem.notify_at) == (new, 0, 0.0)
    # A success resets the backoff at once.
    mem = memory.announced(memory.announced(mem, old, False), old, True)
    assert (mem.notified_offer, mem.notify_failures, mem.notify_at) == (old, 0, 0.0)
    assert memory.get("peer") == PeerMemory()  # an announcement's outcome is the pass's to keep


@pytest.mark.parametrize("status, expected", [
    ({}, False),
    ({"phase": "Pending", "peer": {"clusterUUID": "u"}}, False),
    ({"phase": "Active"}, False),
    ({"phase": "Active", "peer": {"clusterUUID": ""}}, False),
    ({"phase": "Error", "peer": {"clusterUUID": "u"}}, False),
    ({"phase": "Active", "peer": {"clusterUUID": "u"}}, True),
])
def test_grants_follow_only_an_established_peering(status, expected):
    from control.reconcilers.grants import established

    assert established({"status": status}) is expected


def test_a_status_made_with_another_ca_is_recognised():
    from control import pki
    from control.rules.credentials import made_with_other_ca

    old, new = pki.create_ca("old", now=T0), pki.create_ca("new", now=T0)
    assert made_with_other_ca({"access": {"caBundle": old.cert_pem}}, new.cert_pem) is True
    assert made_with_other_ca({"access": {"caBundle": new.cert_pem}}, new.cert_pem) is False
    # Never established (no access yet): nothing to compare, a join or an invite goes on as usual.
    assert made_with_other_ca({}, new.cert_pem) is False
    assert made_with_other_ca({"access": {"caBundle": ""}}, new.cert_pem) is False
    assert made_with_other_ca({"access": {"caBundle": "not a certificate"}}, new.cert_pem) is True
