"""The verdicts of `peering check` as tables, without a cluster (control/check/judge.py, peers.py, report.py,
consumer.parse): every shape a read can take (worked, missing, forbidden, not served) and what the line says."""

from __future__ import annotations

import base64
import datetime
import json

import pytest

from control import pki
from control.check import dex, judge, peers
from control.check.cluster import ERROR, FORBIDDEN, MISSING, OK, UNSERVED, Facts, Read
from control.check.consumer import parse
from control.check.probes import Https, Resolved
from control.check.report import Report, fail, ok, warn
from control.selfcheck import Probe

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)


def facts(**kw) -> Facts:
    return Facts(now=NOW, **kw)


def lease(holder: str = "peering-0", renewed: datetime.timedelta = datetime.timedelta(seconds=1)) -> Read:
    stamp = (NOW - renewed).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Read(OK, {"spec": {"holderIdentity": holder, "renewTime": stamp, "leaseDurationSeconds": 15}})


@pytest.mark.parametrize(("read", "running", "status", "reason"), [
    (lease(), None, "ok", ""),
    (lease(), ["peering-0", "peering-1"], "ok", ""),
    (lease(), ["peering-1"], "warn", "LeaderNotAPod"),
    (lease(holder=""), None, "fail", "NoLeader"),
    (lease(renewed=datetime.timedelta(minutes=3)), None, "fail", "LeaseExpired"),
    (Read(MISSING), None, "fail", "NoLeader"),
    (Read(FORBIDDEN, detail="no"), None, "warn", "Forbidden"),
])
def test_the_leader(read, running, status, reason):
    line = judge.leader_line(facts(lease=read), running)
    assert (line.status, line.reason) == (status, reason), line


def _pod(name: str, ready: bool, waiting: str | None = None) -> dict:
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if waiting:
        status["containerStatuses"] = [{"name": "peering", "restartCount": 4, "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": name}, "status": status}


def test_the_replicas_in_both_shapes():
    # A lab's emulator serves no Deployments: the check says what it reads instead.
    [line], running = judge.replica_lines(facts())
    assert (line.status, line.reason, running) == ("warn", "NoDeploymentAPI", None)
    deployment = Read(OK, {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}})
    pods = Read(OK, {"items": [_pod("peering-a", True), _pod("peering-b", True)]})
    [line], running = judge.replica_lines(facts(deployment=deployment, pods=pods))
    assert line.status == "ok" and running == ["peering-a", "peering-b"]
    broken = Read(OK, {"items": [_pod("peering-a", True), _pod("peering-b", False, "CrashLoopBackOff")]})
    [line], running = judge.replica_lines(facts(deployment=Read(OK, {"spec": {"replicas": 2},
                                                                      "status": {"readyReplicas": 1}}), pods=broken))
    assert line.status == "fail" and "peering-b CrashLoopBackOff (4 restarts)" in line.message
    assert "describe pod peering-b" in line.fix and running == ["peering-a"]
    [line], _ = judge.replica_lines(facts(deployment=Read(MISSING)))
    assert (line.status, line.reason) == ("fail", "NoDeployment") and "spec.enabled: true" in line.fix


@pytest.mark.parametrize(("module", "namespace", "status", "reason"), [
    (Read(OK, {"status": {"phase": "Ready"}}), Read(OK, {}), "ok", ""),
    (Read(OK, {"status": {"phase": "Error", "conditions": [{"status": "False", "message": "no user-authn"}]}}),
     Read(OK, {}), "fail", "ModuleNotReady"),
    (Read(UNSERVED), Read(OK, {}), "warn", "NoModuleAPI"),
    (Read(UNSERVED), Read(MISSING), "fail", "ModuleDisabled"),
])
def test_the_module(module, namespace, status, reason):
    line = judge.module_line(facts(module=module, module_namespace=namespace))
    assert (line.status, line.reason) == (status, reason)


def _config(settings: dict) -> Read:
    return Read(OK, {"spec": {"settings": settings}})


@pytest.mark.parametrize(("module_config", "global_config", "expected"), [
    (Read(UNSERVED), Read(UNSERVED), ("warn", "HttpsModeUnknown")),
    (Read(MISSING), _config({"modules": {"https": {"mode": "Disabled"}}}), ("fail", "HttpsModeUnusable")),
    (_config({"https": {"mode": "CustomCertificate"}}), _config({"modules": {"https": {"mode": "Disabled"}}}),
     ("ok", "")),
    (Read(MISSING), _config({"modules": {}}), ("ok", "")),  # Deckhouse's default: CertManager
])
def test_https_mode(module_config, global_config, expected):
    lines = judge.https_lines(facts(module_config=module_config, global_config=global_config), "peering.x",
                              Https(405, {"reason": "MethodNotAllowed"}))
    assert (lines[0].status, lines[0].reason) == expected
    assert lines[1].check == "join endpoint" and lines[1].status == "ok"


@pytest.mark.parametrize(("join", "status", "reason"), [
    (Https(untrusted="self-signed certificate"), "warn", "JoinCertificateUntrusted"),
    (Https(error="Connection refused"), "fail", "JoinEndpointUnreachable"),
    (Https(503, "503 Service Temporarily Unavailable"), "fail", "JoinEndpointMisrouted"),
])
def test_the_join_endpoint(join, status, reason):
    line = judge.https_lines(facts(), "peering.x", join)[-1]
    assert (line.status, line.reason) == (status, reason)


def test_names_that_do_not_resolve():
    lines = judge.dns_lines([Resolved("peering.x", ("10.0.0.1",)), Resolved("peering-gateway.x", error="NXDOMAIN")])
    assert [l.status for l in lines] == ["ok", "fail"] and "DNS record of peering-gateway.x" in lines[1].fix


def test_the_entrance_from_outside():
    ca = pki.create_ca("x", now=NOW)
    ours = pki.issue_entrance_cert(ca, "%s.x", now=NOW).cert_pem
    secrets = {"peering-ca": Read(OK, {"data": {"tls.crt": base64.b64encode(ca.cert_pem.encode()).decode()}})}
    good = judge.entrance_lines(facts(module_secrets=secrets), "peering-gateway.x", Probe("refused", ours))
    assert [(l.check, l.status) for l in good] == [("entrance", "ok"), ("entrance certificate", "ok")]
    other = pki.issue_entrance_cert(pki.create_ca("lb", now=NOW), "%s.x", now=NOW).cert_pem
    bad = judge.entrance_lines(facts(module_secrets=secrets), "peering-gateway.x", Probe("served", other))
    assert [(l.status, l.reason) for l in bad] == [("fail", "ClientCertNotRequired"), ("fail", "ForeignCert")]
    assert bad[1].fix.startswith("Pass connections") and "peers cannot connect" in bad[1].message
    down = judge.entrance_lines(facts(), "peering-gateway.x", Probe("unreachable", None, "refused"))
    assert [(l.status, l.reason) for l in down] == [("fail", "EntranceUnreachable")]


def test_certificate_states():
    ca = pki.create_ca("x", now=NOW)
    pem = pki.issue_egress_cert(ca, now=NOW).cert_pem
    assert judge.certificate_text(pem, NOW)[0] == "ok"
    assert judge.certificate_text(pem, NOW + datetime.timedelta(hours=7))[0] == "ok"  # renewal due, not overdue
    assert judge.certificate_text(pem, NOW + datetime.timedelta(hours=10))[0] == "overdue"
    assert judge.certificate_text(pem, NOW + datetime.timedelta(hours=13))[0] == "expired"


def _cp(**status) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"capabilities": ["a", "b", "c", "d"]}, "status": status}


def test_why_an_opened_capability_is_not_effective():
    caps = Read(OK, {"items": [
        {"metadata": {"name": "a"}, "spec": {"version": "v1"},
         "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}},
        {"metadata": {"name": "b"}, "spec": {"version": "v1"},
         "status": {"conditions": [{"type": "Accepted", "status": "False", "reason": "Wildcard"}]}},
        {"metadata": {"name": "c"}, "spec": {"version": "v2"},
         "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}}]})
    cp = _cp(effectiveCapabilities=["a"], peer={"capabilities": [{"name": "a", "version": "v1"},
                                                                 {"name": "c", "version": "v1"}]})
    line = peers.capabilities_line(facts(capabilities=caps), cp)
    assert line.status == "warn" and line.message == (
        "effective: a; not effective: b (not Accepted here (Wildcard)); c (versions differ: v2 here, v1 at the "
        "peer); d (no PeeringCapability of this name here)")


@pytest.mark.parametrize(("condition", "status", "reason"), [
    ({"status": "True", "reason": "ProviderReady", "message": "Dex exchanges"}, "ok", ""),
    ({"status": "True", "reason": "ProviderReady", "message": "applied, but the last token exchange failed (X)"},
     "warn", "ProviderReady"),
    ({"status": "False", "reason": "ProviderPending", "message": "wait"}, "warn", "ProviderPending"),
    ({"status": "False", "reason": "ProviderRejected", "message": "no API"}, "fail", "ProviderRejected"),
])
def test_token_exchange(condition, status, reason):
    cp = _cp(conditions=[{"type": "TokenExchangeReady", **condition}])
    line = peers.token_exchange_line(facts(), cp)
    assert (line.status, line.reason) == (status, reason)


def test_a_pending_invite_warns_and_an_error_fails():
    pending = _cp(phase="Pending", conditions=[{"type": "Ready", "status": "False", "reason": "InvitePending",
                                                "message": "waiting"}])
    assert peers.state_line(facts(), pending).status == "warn"
    broken = _cp(phase="Error", conditions=[{"type": "Ready", "status": "False", "reason": "TokenUsed",
                                             "message": "used"}])
    line = peers.state_line(facts(), broken)
    assert (line.status, line.reason) == ("fail", "TokenUsed") and "new one" in line.fix


def test_the_report_text_json_and_exit_code():
    report = Report([ok("a", "fine"), warn("b", "unsure", "look"), fail("c", "broken", "repair it", reason="Why")])
    assert report.exit_code == 1
    assert report.text().splitlines() == ["✓ a: fine", "! b: unsure", "    fix: look", "✗ c: [Why] broken",
                                          "    fix: repair it", "peering check: 1 check failed, 1 warning"]
    doc = json.loads(report.json())
    assert doc["healthy"] is False and doc["checks"][2] == {"status": "fail", "check": "c", "message": "broken",
                                                            "reason": "Why", "fix": "repair it", "peer": ""}
    assert Report([ok("a", "fine"), warn("b", "unsure")]).exit_code == 0


@pytest.mark.parametrize(("args", "error"), [
    (("app", "cap", None, None, None, None), "NAMESPACE/SERVICEACCOUNT"),
    (("ns/app", None, None, None, None, None), "--capability"),
    (("ns/app", "cap", "explode", None, None, None), "--verb 'explode'"),
    (("ns/app", "cap", "get", "configmaps", None, None), "--name"),
    (("ns/app", "cap", "delete", None, None, None), "--resource"),
    (("ns/app", "cap", "list", "configmaps", "Bad_NS", None), "--namespace"),
])
def test_consumer_flags_are_checked(args, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        parse(*args)


def test_reads_that_fail_are_warnings_not_failures():
    line = dex.user_authn_lines(facts(dex_secret=Read(ERROR, detail="boom")), "https://dex.x/",
                                Https(200, {"token_endpoint": "t", "issuer": "i"}))[-1]
    assert (line.check, line.status) == ("dex client", "warn")


def _secret(**values: str) -> Read:
    return Read(OK, {"data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}})


def test_the_lifetimes_are_shown_as_configured_else_as_issued():
    container = {"env": [{"name": "PEERING_CLIENT_CERT_LIFETIME", "value": "7200"}]}
    line = judge.lifetimes_line(facts(), container)
    assert line.status == "ok" and "client certificates issued to peers live 2h (clientCertificateLifetimeSeconds" \
        in line.message and "entrance and egress certificates live 12h (the default; set " \
        "serverCertificateLifetimeSeconds" in line.message
    assert "renewed once the peer is back" in line.message
    assert "live 30s" in judge.lifetimes_line(facts(), {"args": ["run", "--server-cert-lifetime", "30"]}).message
    # No Deployment (a lab cluster, or a role that cannot read it): as the certificates were issued.
    ca = pki.create_ca("x", now=NOW)
    entrance = pki.issue_entrance_cert(ca, "%s.x", now=NOW, lifetime=datetime.timedelta(hours=3))
    peer = pki.make_key_and_csr("u")
    issued = pki.issue_client_cert(ca, peer.cert_pem, "u", now=NOW, lifetime=datetime.timedelta(hours=30))
    f = facts(module_secrets={"peering-gateway-tls": _secret(**{"tls.crt": entrance.cert_pem})},
              peer_secrets={"p": _secret(**{"issued.crt": issued})})
    line = judge.lifetimes_line(f, {})
    assert "entrance and egress certificates live 3h (as the entrance certificate was issued)" in line.message
    assert "client certificates issued to peers live 1d6h (as the certificates issued to peers were)" in line.message
    assert judge.lifetimes_line(facts(), {}).status == "warn"


def _expired_peering(reason: str, message: str) -> tuple[Facts, dict]:
    ca = pki.create_ca("x", now=NOW - datetime.timedelta(days=9))
    key = pki.make_key_and_csr("u")
    expired = pki.issue_client_cert(ca, key.cert_pem, "u", now=NOW - datetime.timedelta(days=3))
    cp = {"metadata": {"name": "p"}, "status": {"phase": "Active", "conditions": [
        {"type": "Ready", "status": "False", "reason": reason, "message": message}]}}
    return facts(), {"cp": cp, "secret": _secret(**{"client.crt": expired})}


def test_a_client_certificate_that_expired_while_the_peer_is_away_is_a_warning_with_nothing_to_do():
    f, p = _expired_peering("PeerUnreachable", "did not answer. Our client certificate ... expired meanwhile")
    line = peers.certificates_line(f, p["cp"], p["secret"])
    assert (line.status, line.reason) == ("warn", "CertificateExpired")
    assert "renewed over the peering as soon as it answers again" in line.fix
    # Refused by a peer with another CA: a failure, and the fix of that case.
    from control.rules import renewal
    f, p = _expired_peering("PeerRefusedCertificate", renewal.PEER_HAS_ANOTHER_CA)
    line = peers.certificates_line(f, p["cp"], p["secret"])
    assert (line.status, line.reason) == ("fail", "CertificateExpired")
    assert "disabled and enabled again" in line.fix
    assert "disabled and enabled again" in peers.state_line(f, p["cp"]).fix


def test_the_sync_line_tells_the_pull_interval_the_deployment_runs_with():
    cp = {"metadata": {"name": "to-b"}, "status": {"peer": {"lastSyncTime": "2026-01-01T00:00:00Z"}, "conditions": [
        {"type": "Ready", "status": "True", "reason": "PeeringReady"}]}}

    def running(*args: str) -> Facts:
        return facts(deployment=Read(OK, {"spec": {"template": {"spec": {"containers": [
            {"name": "peering", "args": ["run", *args]}]}}}}))

    assert "a pull every 30s;" in peers.sync_line(facts(), cp).message
    assert "a pull every 3s;" in peers.sync_line(running("--peer-sync-interval", "3"), cp).message
    assert "a pull every 1m30s;" in peers.sync_line(running("--peer-sync-interval=90"), cp).message
    assert "a pull every 30s;" in peers.sync_line(running("--peer-sync-interval", "soon"), cp).message
