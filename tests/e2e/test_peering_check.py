"""`peering check` against two lab clusters, as an administrator runs it (the real command, with the cluster's
kubeconfig), in every failure the guide names: the peer unreachable (seen at once by the check's own probe, before
the status says it, and within the probe's timeout when the peer never answers), a revoked peering, a
TLS-terminating load balancer in front of the entrance, Dex without its `kubernetes` client (user-authn's publishAPI
off), user-authn missing, a certificate that
expired while the peer was away. Each asserts the exit code, the failing line and its fix; a
healthy peering checks clean, a module's access is proved end to end with `--consumer`, the viewer role is told what
it cannot see. The tests share one peering and run in order.

On both backends. The emulator serves no Deployments or Pods (the lab's peering process runs beside the API), so
there the check judges the replicas by the Lease and says so; on a real kube-apiserver it reads the chart's
Deployment and the Pod the lab writes for its replica (lab/workload.py). tests/e2e/test_peering_check_deckhouse.py
crashes and stops such Pods."""

from __future__ import annotations

import asyncio
import base64
import copy
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
from lab.testing import apiserver_backends
from peering_lab import GROUP, clusterpeer, condition, peered_lab, ready, until, until_equal

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(300)]

CAP = "configmaps-reader"
PROJECT = "shop"


async def _healthy(cluster, name: str, timeout: float = 30.0) -> None:
    await until_equal(lambda: ready(clusterpeer(cluster, name)), ("Active", "True", "PeeringReady"), timeout=timeout)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with peered_lab(tmp_path_factory.mktemp("lab"), CAP, PROJECT, apiserver=request.param) as lab:
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
        for name in ("module", "leader", "https", "entrance", "entrance certificate", "self-check", "user-authn", "dex",
                     "dex audience", "dex client", "module certificates", "certificate lifetimes",
                     "certificates",
                     f"clusterpeer {peer}", "sync", "peer entrance", "token exchange", "capabilities", "projects"):
            line(text, name, "✓")
        assert "accepts the module's client dex-client-peering@d8-peering" in line(text, "dex client", "✓")[0]
        assert "answered an offer pull over mTLS just now" in line(text, "peer entrance", "✓")[0]
        assert f"effective: {CAP}" in text and "1 paired: shop" in text
        # The defaults, 12 and 24 hours: from the Deployment on the real backend, else as the certificates were issued.
        lifetimes = line(text, "certificate lifetimes", "✓")[0]
        assert "entrance and egress certificates live 12h" in lifetimes and "issued to peers live 1d" in lifetimes
        if cluster.apiserver == "real":
            # The chart's Deployment, whose Pod the lab writes for its replica (lab/workload.py).
            assert line(text, "replicas", "✓")[0].endswith(f"1 of 1 replicas ready: lab-{cluster.name}")
        else:
            # The emulator serves no Deployments: the check says what it reads instead, and does not fail for it.
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
    # The roles read the module's Lease, which the leader is judged by.
    assert "held by lab-a" in line(text, "leader", "✓")[0]
    for name in ("dex audience", "dex client", "module certificates", "certificate lifetimes", "certificates",
                 "peer entrance"):
        failing, fix = line(text, name, "!")
        assert "cannot be read with this role" in failing and "administrator" in fix
    assert "client certificate cannot be read" in line(text, "peer entrance", "!")[0]
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


async def test_the_peer_stopped_fails_at_once_before_the_status_says_it(lab):
    a, b = lab["a"], lab["b"]
    await _healthy(b, "to-a")
    await a.stop_peering()
    try:
        started = asyncio.get_running_loop().time()
        code, text = await check(b, "--timeout", "3")
        took = asyncio.get_running_loop().time() - started
        failing, fix = line(text, "peer entrance")
        assert code == 1 and "[PeerUnreachable] peering-gateway.a.lab" in failing and "does not answer" in failing
        assert "peering-gateway.<domain> of the other cluster" in fix
        if "✓ clusterpeer to-a:" in text:   # the module's next pull has not seen it yet: the check says so
            assert "is older than this probe" in failing
        assert took < 3 + 15, f"the check took {took:.1f}s"
        # `--peer` probes the peer too, not only its status.
        code, text = await check(b, "--peer", "to-a", "--timeout", "3")
        assert code == 1 and "[PeerUnreachable]" in line(text, "peer entrance")[0]
        # Once the status has caught up it says the same.
        text = await until_check(b, code=1, timeout=30)
        assert "[PeerUnreachable]" in line(text, "clusterpeer to-a")[0]
    finally:
        await a.start_peering()
    await _healthy(b, "to-a")
    text = await until_check(b, code=0, timeout=30)
    line(text, "peer entrance", "✓")


async def test_a_peer_that_never_answers_fails_within_the_probes_timeout(lab):
    """An entrance that takes the connection and says nothing (a black hole): the probe gives up after its
    timeout, and the whole check ends within it, while the ClusterPeer's status, from the module's own pulls, is
    still fine."""
    b = lab["b"]
    held: list[asyncio.StreamWriter] = []

    async def hold(reader, writer):
        held.append(writer)   # never answers, never closes

    hole = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = hole.sockets[0].getsockname()[1]
    try:
        started = asyncio.get_running_loop().time()
        code, text = await check(b, "--timeout", "2", resolve={"peering-gateway.a.lab": f"127.0.0.1:{port}"})
        took = asyncio.get_running_loop().time() - started
        failing, _ = line(text, "peer entrance")
        assert code == 1 and "[PeerUnreachable]" in failing and "is older than this probe" in failing
        line(text, "clusterpeer to-a", "✓")
        assert 2 <= took < 2 + 15, f"the check took {took:.1f}s"
        assert held, "the probe connected to the black hole"
    finally:
        for writer in held:
            writer.close()
        hole.close()
        await hole.wait_closed()


async def test_dex_without_its_kubernetes_client(lab):
    """user-authn's publishAPI off: Dex has no `kubernetes` client. The check says so before any exchange, and
    once a consumer's exchange has failed, the peering's TokenExchangeReady message names publishAPI too."""
    a, b = lab["a"], lab["b"]
    config = a.api.get("deckhouse.io", "moduleconfigs", "user-authn")
    saved = copy.deepcopy(config["spec"])
    config["spec"]["settings"] = {}
    a.api.update(config)
    try:
        text = await until_check(a, code=1)
        failing, fix = line(text, "dex audience")
        assert "[NoKubernetesClient] Dex has no `kubernetes` client" in failing and "500 server_error" in failing
        assert "publishAPI" in fix and "d8 k patch moduleconfig user-authn" in fix
        # A consumer of b reaches a, whose Dex now refuses the exchange.
        args = ("--peer", "to-a", "--consumer", "consumer/app", "--capability", CAP, "--resource", "configmaps",
                "--namespace", PROJECT)
        code, text = await check(b, *args)
        assert code == 1 and "TokenExchangeMisconfigured" in text
        await until(lambda: "publishAPI is enabled" in condition(clusterpeer(a, "to-b"), "TokenExchangeReady")
                    .get("message", ""), what="TokenExchangeReady naming publishAPI")
    finally:
        config = a.api.get("deckhouse.io", "moduleconfigs", "user-authn")
        config["spec"] = saved
        a.api.update(config)
    text = await until_check(a, code=0, timeout=30)
    line(text, "dex audience", "✓")
    await until_check(b, *args, code=0, timeout=30)


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
