"""Pure parts of the runtime: settings validation, relist diffs, lease rules, feed snapshots, error typing."""

from __future__ import annotations

import base64
import datetime
import random

import pytest

from control import feed, kube, lease
from control.config import Settings, check_domain_template
from control.watch import JitteredBackoff, diff_stores


@pytest.mark.parametrize("template", ["%s.example.com", "%s-lab.x.lab"])
def test_good_domain_templates(template):
    s = Settings(public_domain_template=template)
    assert s.entrance_host == template % "peering-gateway"
    assert s.join_host == template % "peering"


@pytest.mark.parametrize("template", ["example.com", "%s.%s.com", "%d.example.com", "%s/x", "%s..com", "%s .com"])
def test_bad_domain_templates_say_what_is_expected(template):
    with pytest.raises(ValueError, match="%s.example.com"):
        check_domain_template(template)


def obj(name, rv, ns=None):
    meta = {"name": name, "resourceVersion": rv}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta}


def test_diff_stores_reports_only_differences():
    old = {"a": obj("a", "1"), "b": obj("b", "2"), "c": obj("c", "3")}
    new = {"a": obj("a", "1"), "b": obj("b", "5"), "d": obj("d", "6")}
    events = sorted((t, o["metadata"]["name"]) for t, o in diff_stores(old, new))
    assert events == [("ADDED", "d"), ("DELETED", "c"), ("MODIFIED", "b")]
    assert diff_stores(new, new) == []


def test_jittered_backoff_grows_within_bounds_and_resets():
    b = JitteredBackoff(base=1.0, cap=8.0, rng=random.Random(1))
    delays = [b.next() for _ in range(6)]
    ceilings = [1, 2, 4, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings))
    b.reset()
    assert b.next() <= 1.0


def test_error_from_status_types_the_error():
    status = {"kind": "Status", "code": 409, "reason": "AlreadyExists", "message": "exists"}
    err = kube.error_from_status(409, status)
    assert isinstance(err, kube.AlreadyExists) and isinstance(err, kube.Conflict)
    assert isinstance(kube.error_from_status(410, {"kind": "Status", "code": 410, "reason": "Expired"}), kube.Gone)
    assert isinstance(kube.error_from_status(404, "not json"), kube.NotFound)
    err = kube.error_from_status(422, {"kind": "Status", "code": 422, "reason": "Invalid", "message": "bad"})
    assert isinstance(err, kube.Invalid) and err.message == "bad"
    assert type(kube.error_from_status(500, {})) is kube.ApiError


def test_resource_paths():
    assert kube.SECRETS.path("ns", "a") == "/api/v1/namespaces/ns/secrets/a"
    assert kube.SECRETS.path() == "/api/v1/secrets"
    assert kube.CLUSTERPEERS.path(None, "x", "status") == "/apis/peering.deckhouse.io/v1alpha1/clusterpeers/x/status"
    with pytest.raises(ValueError, match="cluster-scoped"):
        kube.CLUSTERPEERS.path("ns")
    assert kube._resource_of("/apis/coordination.k8s.io/v1/namespaces/x/leases/peering") == "leases"


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def lease_obj(holder, rv, transitions=0, duration=15):
    spec = {"leaseDurationSeconds": duration, "leaseTransitions": transitions}
    if holder:
        spec["holderIdentity"] = holder
    return {"metadata": {"resourceVersion": rv}, "spec": spec}


def test_lease_expiry_is_measured_on_the_local_clock_since_the_record_changed():
    obs = lease.observe(lease_obj("a", "1"), None, now=100.0)
    assert not lease.may_take(obs, "b", 110.0)
    assert lease.may_take(obs, "a", 110.0)
    # The same record read again later does not restart the clock; a renewal (new resourceVersion) does.
    obs = lease.observe(lease_obj("a", "1"), obs, now=114.0)
    assert lease.may_take(obs, "b", 115.5)
    obs = lease.observe(lease_obj("a", "2"), obs, now=115.0)
    assert not lease.may_take(obs, "b", 115.5)
    assert lease.may_take(lease.observe(lease_obj("", "3"), obs, now=116.0), "b", 116.0)


def test_lease_spec_counts_transitions_and_keeps_acquire_time_on_renew():
    spec = lease.desired_spec(None, "a", 15, NOW, None)
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"] == "2026-01-01T00:00:00.000000Z"
    obs = lease.observe({"metadata": {"resourceVersion": "1"}, "spec": spec}, None, 0.0)
    later = NOW + datetime.timedelta(seconds=5)
    renewed = lease.desired_spec(obs, "a", 15, later, spec)
    assert renewed["acquireTime"] == spec["acquireTime"] and renewed["leaseTransitions"] == 0
    assert renewed["renewTime"] == "2026-01-01T00:00:05.000000Z"
    taken = lease.desired_spec(obs, "b", 15, later, spec)
    assert taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 1
    assert taken["acquireTime"] == taken["renewTime"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret(name, **data):
    return {"metadata": {"name": name, "namespace": "d8-peering"}, "data": {k.replace("_", "."): b64(v)
                                                                             for k, v in data.items()}}


def test_certificates_need_all_three_secrets():
    secrets = {"peering-ca": secret("peering-ca", tls_crt=b"CA", tls_key=b"CAKEY"),
               "peering-gateway-tls": secret("peering-gateway-tls", tls_crt=b"E", tls_key=b"EK")}
    assert feed.certificates_from(secrets) is None
    secrets["peering-egress-tls"] = secret("peering-egress-tls", tls_crt=b"G", tls_key=b"GK")
    certs = feed.certificates_from(secrets)
    assert (certs.entrance_cert_pem, certs.entrance_key_pem, certs.ca_pem, certs.egress_cert_pem,
            certs.egress_key_pem) == (b"E", b"EK", b"CA", b"G", b"GK")
    assert "EK" not in repr(certs)


def test_registry_snapshot_takes_the_cluster_uuid_and_ignores_non_peer_secrets():
    registry = feed.build_registry(
        configmap={"data": {"cluster-uuid": " u-1 "}}, clusterpeers=[], capabilities=[], generation=7,
        secrets=[secret("peering-ca", tls_crt=b"x")])
    assert registry.cluster_uuid == "u-1" and registry.generation == 7 and not registry.peers
