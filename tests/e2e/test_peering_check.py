"""`peering check` against two lab clusters, as an administrator runs it (the real command, with the cluster's
kubeconfig), in every failure the guide names: the peer unreachable, a revoked peering, a TLS-terminating load
balancer in front of the entrance, user-authn missing, a certificate that expired while the peer was away. Each asserts the exit code, the
failing line and its fix; a healthy peering checks clean, a module's access is proved end to end with
`--consumer`, the viewer role is told what it cannot see. The tests share one peering and run in order.

The lab's emulated API server serves no Deployments or Pods (its peering process runs beside it), so the check
reads the Lease there instead and says so; tests/e2e/test_peering_check_deckhouse.py checks the other shape, a
Deployment with its Pods on a real kube-apiserver."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import re
import ssl

import aiohttp
import pytest
import pytest_asyncio
import trustme

from control import pki
from lab.cluster import peering_executable
from check_helpers import check, line
from lab.ingress import Ingress
from peering_lab import GROUP, clusterpeer, condition, peered_lab, ready, until_equal

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(300)]

CAP = "configmaps-reader"
PROJECT = "shop"


async def _healthy(cluster, name: str, timeout: float = 30.0) -> None:
    await until_equal(lambda: ready(clusterpeer(cluster, name)), ("Active", "True", "PeeringReady"), timeout=timeout)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory):
    async with peered_lab(tmp_path_factory.mktemp("lab"), CAP, PROJECT) as lab:
        for cluster, name in ((lab["a"], "to-b"), (lab["b"], "to-a")):
            await until_equal(lambda: clusterpeer(cluster, name)["status"].get("pairedProjectsCount"), 1)
        yield lab


async def until_check(cluster, *args: str, code: int, timeout: float = 20.0, **kw) -> str:
    """Run the check until it exits with `code` (the clusters need a moment to see a change)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got, text = await check(cluster, *args, **kw)
        if got == code or asyncio.get_running_loop().time() > deadline:
            assert got == code, text
            return text
        await asyncio.sleep(0.5)


async def test_a_healthy_peering_checks_clean(lab):
    for cluster, peer in ((lab["a"], "to-b"), (lab["b"], "to-a")):
        text = await until_check(cluster, code=0)
        for name in ("leader", "entrance", "entrance certificate", "self-check", "dex", "dex client",
                     "module certificates", "certificate lifetimes", "certificates",
                     f"clusterpeer {peer}", "sync", "token exchange", "capabilities", "projects"):
            line(text, name, "✓")
        assert f"effective: {CAP}" in text and "1 paired: shop" in text
        # No Deployment in the lab: the lifetimes as the certificates were issued (the defaults, 12 and 24 hours).
        lifetimes = line(text, "certificate lifetimes", "✓")[0]
        assert "entrance and egress certificates live 12h" in lifetimes and "issued to peers live 1d" in lifetimes
        # The lab serves no Deployments: the check says what it reads instead, and does not fail for it.
        assert line(text, "replicas", "!")[0].endswith("which only a running replica renews")
        code, raw = await check(cluster, "-o", "json")
        report = json.loads(raw)
        assert code == 0 and report["healthy"] is True
        assert {c["status"] for c in report["checks"]} <= {"ok", "warn"}
        assert any(c["check"] == f"clusterpeer {peer}" and c["peer"] == peer for c in report["checks"])


async def test_a_modules_access_is_proved_end_to_end(lab):
    b = lab["b"]
    args = ("--peer", "to-a", "--consumer", "consumer/app", "--capability", CAP)
    # Right after Ready the peer's gateway may not know b's issuer yet: wait for the first clean run.
    text = await until_check(b, *args, "--resource", "configmaps", "--namespace", PROJECT, code=0)
    assert "list configmaps in shop on to-a answered 200 through both gateways, 1 item" in line(
        text, "consumer request", "✓")[0]
    assert "(TokenRequest, 10 minutes; not shown)" in line(text, "consumer token", "✓")[0]
    # Outside what the capability grants: the peer's RBAC refuses, and the check says what grants what.
    code, text = await check(b, *args, "--resource", "secrets", "--namespace", PROJECT)
    failing, fix = line(text, "consumer request")
    assert code == 1 and "HTTP 403 Forbidden" in failing and "capability's rules there" in fix
    # A write is never made: it is asked as a SelfSubjectAccessReview through both gateways.
    code, text = await check(b, *args, "--verb", "delete", "--resource", "configmaps", "--namespace", PROJECT,
                             "--name", "prices")
    assert code == 1 and "is not allowed" in line(text, "consumer request")[0]
    assert b.api.get("", "configmaps", "prices", PROJECT) is not None and \
        lab["a"].api.get("", "configmaps", "prices", PROJECT) is not None
    # A capability that is not effective: no token is asked for.
    code, text = await check(b, "--peer", "to-a", "--consumer", "consumer/app", "--capability", "nodes-reader")
    failing, fix = line(text, "consumer")
    assert code == 1 and "[NoEffectiveCapability]" in failing and "spec.capabilities" in fix
    # Bad flags: exit 2 with what to give.
    proc = await asyncio.create_subprocess_exec(*peering_executable(), "check", "--consumer", "app",
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2 and "--consumer needs --peer" in err.decode()


async def test_the_viewer_role_is_told_what_it_cannot_read(lab):
    a = lab["a"]
    a.api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer", "namespace": "default"}})
    for role in ("d8:user-authz:peering:user", "d8:system-capability:peering:view"):
        a.api.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                      "metadata": {"name": f"viewer-{role.replace(':', '-')}"},
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                      "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "default"}]})
    sa = a.api.get("", "serviceaccounts", "viewer", "default")
    token, _ = a.api.sa_issuer.issue("default", "viewer", sa["metadata"]["uid"], [], 600)
    admin = json.loads(a.path("kubeconfig").read_text())
    admin["users"][0]["user"] = {"token": token}
    path = a.path("viewer-kubeconfig")
    path.write_text(json.dumps(admin))
    path.chmod(0o600)
    code, text = await check(a, kubeconfig=str(path))
    assert code == 0, "the viewer role sees a healthy peering as healthy"
    line(text, "clusterpeer to-b", "✓")
    assert "[Forbidden] the Lease d8-peering/peering cannot be read" in line(text, "leader", "!")[0]
    for name in ("dex client", "module certificates", "certificate lifetimes", "certificates"):
        failing, fix = line(text, name, "!")
        assert "cannot be read with this role" in failing and "administrator" in fix
    assert token not in text


async def test_a_tls_terminating_load_balancer_in_front_of_the_entrance(lab):
    a = lab["a"]
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("peering-gateway.a.lab").configure_cert(context)
    terminator = Ingress("peering-gateway.a.lab", context)  # terminates TLS, answers 503 without a backend
    await terminator.start()
    a.entrance_lb.set_target(terminator.port)
    try:
        text = await until_check(a, code=1)
        failing, fix = line(text, "entrance")
        assert "[ClientCertNotRequired]" in failing and "something in front of it terminates TLS" in failing
        assert "without TLS decryption" in fix
        failing, fix = line(text, "entrance certificate")
        assert "[ForeignCert]" in failing and "without TLS termination" in fix
        # The module's own self-check sees it too, on its ClusterPeers.
        await until_equal(lambda: condition(clusterpeer(a, "to-b"), "ClientCertEnforced").get("reason"),
                          "ClientCertNotRequired")
        code, text = await check(a)
        assert "[ClientCertNotRequired]" in line(text, "self-check")[0]
    finally:
        a.entrance_lb.set_target(a.ports["entrance"])
        await terminator.stop()
    await until_check(a, code=0, timeout=30)


async def test_the_peer_unreachable(lab):
    a, b = lab["a"], lab["b"]
    await a.stop_peering()
    try:
        text = await until_check(b, code=1, timeout=30)
        failing, fix = line(text, "clusterpeer to-a")
        assert "[PeerUnreachable]" in failing and "Active, Ready False" in failing
        assert "peering-gateway.<domain> of the other cluster" in fix
        assert "[PeerUnreachable]" in line(text, "sync")[0] and "stays in force" in line(text, "sync")[0]
        assert "[PeerUnreachable]" in line(text, "projects")[0]
    finally:
        await a.start_peering()
    await _healthy(b, "to-a")
    await until_check(b, code=0, timeout=30)


def _secret(cluster, name: str) -> dict[str, str]:
    secret = cluster.api.get("", "secrets", name, "d8-peering")
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def _put(cluster, name: str, values: dict[str, str]) -> None:
    secret = cluster.api.get("", "secrets", name, "d8-peering")
    secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    cluster.api.update(secret)


async def test_a_certificate_that_expired_while_the_peer_was_away(lab):
    a, b = lab["a"], lab["b"]
    saved_a, saved_b = _secret(a, "peer-to-b"), _secret(b, "peer-to-a")
    a_ca = _secret(a, "peering-ca")
    b_uuid = b.info()["uuid"]
    # As if b's last renewal had been 30 hours ago and a had been away since: a issued it and knows it.
    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=30)
    expired = pki.issue_client_cert(pki.CertAndKey(a_ca["tls.crt"], a_ca["tls.key"]),
                                    pki.csr_for_key(saved_b["client.key"], b_uuid), b_uuid, now=then)
    await a.stop_peering()
    try:
        _put(a, "peer-to-b", {**saved_a, "issued.crt": expired + saved_a["issued.crt"]})
        _put(b, "peer-to-a", {**saved_b, "client.crt": expired})
        await until_equal(lambda: ready(clusterpeer(b, "to-a")), ("Active", "False", "PeerUnreachable"), timeout=20)
        text = await until_check(b, code=1)
        failing, fix = line(text, "certificates", "!")
        assert "[CertificateExpired]" in failing and "ours toward the peer expired at" in failing
        assert "renewed over the peering as soon as it answers again" in fix and "anew" not in fix
        failing, fix = line(text, "clusterpeer to-a")
        assert "[PeerUnreachable]" in failing and "expired meanwhile" in failing and "nothing to do" in failing
    finally:
        await a.start_peering()
    # Back: b renews the expired certificate by itself, for the same key, and the check is clean again.
    await _healthy(b, "to-a")
    renewed = _secret(b, "peer-to-a")["client.crt"]
    assert renewed != expired and pki.public_key_fingerprint(renewed) == pki.public_key_fingerprint(expired)
    await until_check(b, code=0, timeout=30)


async def test_a_revoked_peering(lab):
    a, b = lab["a"], lab["b"]
    a.api.delete(GROUP, "clusterpeers", "to-b")
    await until_equal(lambda: ready(clusterpeer(b, "to-a")), ("Active", "False", "PeerRefusedCertificate"),
                      timeout=20)
    text = await until_check(b, code=1)
    failing, fix = line(text, "clusterpeer to-a")
    assert "[PeerRefusedCertificate]" in failing and "revoked" in failing
    assert "delete this ClusterPeer too" in fix
    # Only that peering fails: `--peer` of another one would be clean, and a name that does not exist says so.
    code, text = await check(b, "--peer", "nope")
    assert code == 1 and "`d8 k get clusterpeers`" in line(text, "clusterpeer nope")[1]


async def test_user_authn_missing(lab):
    a = lab["a"]
    # What a cluster without user-authn has: no Dex, no TokenExchangeProvider API, no Secret of the Dex client.
    await a.dex.stop()
    a.api.delete("apiextensions.k8s.io", "customresourcedefinitions", "tokenexchangeproviders.deckhouse.io")
    a.api.delete("", "secrets", "dex-client-peering", "d8-peering")
    text = await until_check(a, code=1)
    failing, fix = line(text, "user-authn")
    assert "[UserAuthnMissing]" in failing and "enable user-authn" in fix
    failing, fix = line(text, "dex")
    assert "[DexUnreachable]" in failing and "d8-user-authn" in fix
    failing, fix = line(text, "dex client")
    assert "[NoDexSecret]" in failing and "DexClient d8-peering/peering" in fix


async def test_no_secret_in_an_event_a_log_line_or_a_metric(lab):
    """Everything the clusters wrote during these tests: their Events, the peering processes' logs and /metrics."""
    secrets: list[str] = []
    for cluster in (lab["a"], lab["b"]):
        for s in cluster.api.list("", "secrets", "d8-peering"):
            for key, value in (s.get("data") or {}).items():
                text = base64.b64decode(value).decode(errors="replace")
                # Private keys and the Dex client's secret; certificates, CAs, UUIDs and hosts are public.
                if "PRIVATE KEY" in text:
                    secrets.extend(ln for ln in text.splitlines() if ln and "-----" not in ln)
                elif key == "clientSecret":
                    secrets.append(text)
        secrets.append(cluster.dex_client_secret)
    invite = (clusterpeer(lab["b"], "to-a") or {}).get("spec", {}).get("join", {}).get("connectionString")
    secrets.append(invite.split(".", 1)[1][:40])
    seen = []
    for cluster in (lab["a"], lab["b"]):
        events = cluster.api.list("", "events")
        assert events, "the clusters recorded Events"
        seen.append(json.dumps(events))
        seen.append(cluster.path("peering.log").read_text(errors="replace"))
        if cluster.process is not None:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{cluster.ports['ops']}/metrics") as resp:
                    metrics = await resp.text()
            assert "peering_leader 1.0" in metrics and "peering_certificate_expiry_timestamp_seconds{" in metrics
            if cluster is lab["b"]:  # a's peering was revoked above
                assert 'peering_peer_ready{peer="to-a"} 0.0' in metrics
            seen.append(metrics)
    everything = "\n".join(seen)
    leaked = [s[:12] + "..." for s in secrets if s and s in everything]
    assert leaked == []
    assert not re.search(r"d8peer1\.[A-Za-z0-9_-]{20,}", everything)
    assert not re.search(r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.", everything), "a JWT"
