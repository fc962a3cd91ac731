"""Every reconciler of the process, driven pass by pass on a fake clock against the emulated API server, with the
session's write counter: the pass after one that changed something writes nothing, and so does a pass after the
clock moved past every interval; what falls due later (a renewal, an expiry, a retry, a pull) happens when the clock
says so. No reconcile runs on its own here (no work queue, no Lease) and no test sleeps.

The established peering talks to a stand-in of the peer's entrance: real mTLS with the peer's own CA, the four
peer operations answered with the messages `rules.join` defines."""

from __future__ import annotations

import datetime
import json
import socket
import ssl

import pytest
from aiohttp import web
from jwcrypto import jwk

from contract.names import uuid_claim_name
from contract.peer_secret import PeerCredentials
from control import connstring, pki
from control.config import ControlSettings, KubeSettings, Settings
from control.context import Context
from control.handlers.dispatch import Handlers
from control.informers import Informers
from control.process import RECONCILERS
from control.rules import credentials as creds
from control.rules import join as join_rules
from control.rules.conditions import get_condition
from control.selfcheck import CONFIRM_SECONDS, RETRY_SECONDS
from control.watch import ObjectPoller
from tests.control.conftest import CLUSTER_UUID, NAMESPACE, FakeClock, eventually
from tests.ports import closed_port

GROUP = "peering.deckhouse.io"
API_VERSION = f"{GROUP}/v1alpha1"
PEER_UUID = "7c5e0000-0000-4000-8000-0000000000b2"
PEER_ENTRANCE = "peering-gateway.y.lab"
DAY = 86400.0
HOUR = 3600.0


class World:
    """The reconcilers of one process on a fake clock, with the informers they read, and nothing else running."""

    def __init__(self, server, kube, clock: FakeClock, resolve: dict[str, str], *, controller=None) -> None:
        self.server = server
        self.kube = kube
        self.clock = clock
        settings = Settings(public_domain_template="%s.t.lab",
                            kube=KubeSettings(namespace=NAMESPACE),
                            control=ControlSettings(peer_sync_interval=30.0, selfcheck_interval=60.0),
                            resolve=resolve)
        self.informers = Informers(kube, optional_recheck=3600)
        self.ctx = Context(settings, kube, self.informers, Handlers(), controller=controller, clock=clock)
        self.reconcilers = {r.name: r for r in (make(self.ctx) for make in RECONCILERS)}
        for reconciler in self.reconcilers.values():
            for w in reconciler.watches:
                self.informers.get(w.resource, namespace=w.namespace, label_selector=w.label_selector,
                                   field_selector=w.field_selector)
        self.ctx.cluster_uuid_informer()

    async def start(self) -> None:
        self.informers.start()
        await self.informers.wait_synced()

    async def stop(self) -> None:
        await self.ctx.close()
        await self.informers.stop()

    def writes(self) -> int:
        return sum(self.kube.write_counts.values())

    async def caught_up(self) -> None:
        """Wait until every cache holds what the API server holds (the reconcilers read the caches)."""
        async def same() -> bool:
            for informer in self.informers:
                resource = getattr(informer, "resource", None)
                if isinstance(informer, ObjectPoller) or resource is None:
                    continue
                listed = await self.kube.list(resource, getattr(informer, "namespace", None),
                                              label_selector=getattr(informer, "label_selector", None),
                                              field_selector=getattr(informer, "field_selector", None))
                want = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                        for o in listed["items"]}
                have = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                        for o in informer.items()}
                if want != have:
                    return False
            return True
        await eventually(same, what="the caches to hold what the API server holds")

    async def run(self, reconciler: str, key: str) -> int:
        """One pass on caches that hold every earlier write; returns how many writes it made."""
        await self.caught_up()
        before = self.writes()
        await self.reconcilers[reconciler].reconcile(key)
        return self.writes() - before

    async def settle(self, reconciler: str, key: str) -> int:
        """Passes until one writes nothing (at most three), then one more that must write nothing either."""
        total = 0
        for _ in range(3):
            wrote = await self.run(reconciler, key)
            total += wrote
            if wrote == 0:
                break
        assert await self.run(reconciler, key) == 0, f"{reconciler} {key} keeps writing"
        return total


@pytest.fixture
async def world(api, kube):
    server, _ = api
    clock = FakeClock()
    entrance = f"127.0.0.1:{closed_port()}"
    w = World(server, kube, clock, {"peering-gateway.t.lab": entrance, "peering.gone.lab": entrance})
    await w.start()
    try:
        # The cluster's CA and server certificates, which every other pass needs.
        assert await w.run("certificates", "certificates") == 3
        yield w
    finally:
        await w.stop()


def clusterpeer(world: World, name: str) -> dict:
    return world.server.get(GROUP, "clusterpeers", name)


async def test_certificates_are_written_once_and_renewed_when_the_clock_says(world):
    assert await world.run("certificates", "certificates") == 0
    world.clock.advance(HOUR)
    assert await world.run("certificates", "certificates") == 0
    world.clock.advance(5 * HOUR)  # half of the servers' 12 hours
    assert await world.run("certificates", "certificates") == 2
    assert await world.run("certificates", "certificates") == 0


async def test_server_certificates_expired_during_an_outage_are_renewed_at_the_first_pass_the_ca_kept(world):
    ca = world.server.get("", "secrets", "peering-ca", NAMESPACE)["data"]
    # The process was away for 30 days, far longer than the servers' 12 hours: its first pass as leader renews
    # both (the entrance serves neither meanwhile: control/feed.py), and the CA of every peering stays.
    world.clock.advance(30 * DAY)
    assert await world.run("certificates", "certificates") == 2
    for name in ("peering-gateway-tls", "peering-egress-tls"):
        cert = creds.secret_values(world.server.get("", "secrets", name, NAMESPACE))["tls.crt"]
        assert pki.valid_at(cert, world.clock.now()) and not pki.needs_renewal(cert, world.clock.now())
    assert world.server.get("", "secrets", "peering-ca", NAMESPACE)["data"] == ca
    assert await world.run("certificates", "certificates") == 0


async def test_capability_status_is_written_once(world):
    world.server.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": "cm"},
                         "spec": {"version": "v1", "consumers": [{"namespace": "d8-m", "name": "ctl"}],
                                  "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}})
    await world.caught_up()
    assert await world.run("peeringcapability", "cm") == 1
    assert await world.run("peeringcapability", "cm") == 0
    world.clock.advance(DAY)
    assert await world.run("peeringcapability", "cm") == 0


async def test_an_invite_is_written_once_and_replaced_when_it_expires_unused(world):
    world.server.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "inv"},
                         "spec": {"type": "Invite", "invite": {"tokenTTL": "1h"}}})
    await world.caught_up()
    assert await world.run("clusterpeer", "inv") == 1
    assert await world.run("clusterpeer", "inv") == 0
    first = clusterpeer(world, "inv")["status"]["invite"]
    # The self-check finds no entrance: it probes again sooner, and says so once that is confirmed (one write).
    assert get_condition(clusterpeer(world, "inv")["status"]["conditions"], "ClientCertEnforced") is None
    wrote = 0
    for seconds in (RETRY_SECONDS, 2 * RETRY_SECONDS, CONFIRM_SECONDS):
        world.clock.advance(seconds)
        wrote += await world.run("clusterpeer", "inv")
    assert wrote == 1
    assert get_condition(clusterpeer(world, "inv")["status"]["conditions"], "ClientCertEnforced")["reason"] == \
        "EntranceUnreachable"
    # Past two self-check intervals: probed again, the same answer, nothing written.
    world.clock.advance(30 * 60)
    assert await world.run("clusterpeer", "inv") == 0
    assert await world.run("grants", "inv") == 0  # nothing is established: nothing to grant
    world.clock.advance(31 * 60)
    assert await world.settle("clusterpeer", "inv") == 1
    second = clusterpeer(world, "inv")["status"]["invite"]
    assert second["tokenID"] != first["tokenID"] and second["used"] is False


async def test_a_copy_of_the_connection_string_in_an_annotation_is_removed_and_only_its_key_is_told(world, caplog):
    """kubectl's client-side apply copies the whole object into kubectl.kubernetes.io/last-applied-configuration,
    which nothing masks; where no admission policy refused or stripped it (a cluster without the chart's policies,
    or a ClusterPeer older than them), the reconciler removes it, and nothing else of the object, in one write."""
    now = world.clock.now()
    inviter = pki.create_ca("inviter", now=now)
    text = connstring.encode(connstring.Invitation(
        "a0000000-0000-4000-8000-000000000001", "https://peering.gone.lab", "peering-gateway.gone.lab",
        pki.spki_pin(inviter.cert_pem), "abcdefgh", "s" * 43, now + datetime.timedelta(hours=1)))
    manifest = {"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "applied"},
                "spec": {"type": "Join", "join": {"connectionString": text}}}
    world.server.create({**manifest, "metadata": {"name": "applied", "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(manifest), "team": "platform"}}})
    await world.caught_up()
    with caplog.at_level("INFO"):
        assert await world.run("clusterpeer", "applied") == 1  # the removal, and nothing else in that pass
    stored = clusterpeer(world, "applied")
    assert stored["metadata"]["annotations"] == {"team": "platform"}
    assert stored["spec"]["join"]["connectionString"] == text and "status" not in stored
    [record] = [r for r in caplog.records if "copy of the connection string" in r.getMessage()]
    assert record.annotations == ["kubectl.kubernetes.io/last-applied-configuration"]
    assert text.split(".", 1)[1][:40] not in repr(vars(record)) + caplog.text
    # The next pass goes on with the join as for any ClusterPeer (the key kept, the refusal in the status; the
    # inviter's UUID is claimed only once its answer checks).
    assert await world.run("clusterpeer", "applied") == 2
    assert text not in json.dumps({k: v for k, v in clusterpeer(world, "applied").items() if k != "spec"})


async def test_a_join_that_cannot_reach_the_inviter_is_retried_when_due_and_writes_nothing_more(world):
    now = world.clock.now()
    inviter = pki.create_ca("inviter", now=now)
    text = connstring.encode(connstring.Invitation(
        "a0000000-0000-4000-8000-000000000001", "https://peering.gone.lab", "peering-gateway.gone.lab",
        pki.spki_pin(inviter.cert_pem), "abcdefgh", "s" * 43, now + datetime.timedelta(hours=1)))
    world.server.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "nowhere"},
                         "spec": {"type": "Join", "join": {"connectionString": text}}})
    await world.caught_up()
    # The key is kept before the call (one write), then the status says why the join did not happen (another); the
    # inviter's UUID is claimed only once an answer checks.
    assert await world.run("clusterpeer", "nowhere") == 2
    status = clusterpeer(world, "nowhere")["status"]
    assert (status["phase"], get_condition(status["conditions"], "Ready")["reason"]) == \
        ("Pending", "JoinEndpointUnreachable")
    memory = world.reconcilers["clusterpeer"].memory
    assert await world.run("clusterpeer", "nowhere") == 0 and memory.get("nowhere").join_failures == 1  # not due
    world.clock.advance(5)
    assert await world.run("clusterpeer", "nowhere") == 0  # retried, refused the same way, the same key kept
    assert memory.get("nowhere").join_failures == 2
    assert set(world.server.get("", "secrets", "peer-nowhere", NAMESPACE)["data"]) == {"client.key"}
    # No answer, no claim: a cluster whose inviter is unreachable does not hold that inviter's UUID.
    assert world.server.get("coordination.k8s.io", "leases", uuid_claim_name("a0000000-0000-4000-8000-000000000001"),
                            NAMESPACE) is None


class PeerEntrance:
    """The peer's entrance: TLS with a certificate of the peer's CA, client certificates of that CA required."""

    def __init__(self, ca: pki.CertAndKey, tmp_path) -> None:
        self.ca = ca
        self.tmp_path = tmp_path
        self.calls: list[str] = []
        key = jwk.JWK.generate(kty="EC", crv="P-256", kid="peer")
        self.offer = {"issuer": {"url": "https://kubernetes.default.svc.cluster.local",
                                 "jwks": json.dumps({"keys": [json.loads(key.export_public())]})},
                      "projects": [{"name": "shop", "namespaces": ["shop"]}],
                      "capabilities": [{"name": "cm", "version": "v1", "scope": ["project"]},
                                       {"name": "nodes", "version": "v1", "scope": ["cluster"]}],
                      "peeringVersion": "0.1.0"}
        self.runner: web.AppRunner | None = None

    async def _op(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        self.calls.append(op)
        if op == "offer" and request.method == "GET":
            return web.json_response(join_rules.offer_message("to-x", self.offer))
        if op == "certificate" and request.method == "POST":
            csr = join_rules.parse_certificate_request(await request.json())
            # On the machine's clock, which TLS checks it against. This peer's CA issues for 90 days, so that the
            # renewed certificate is not due again on the test's clock, which runs 13 hours ahead by then.
            cert = pki.issue_client_cert(self.ca, csr, CLUSTER_UUID, now=datetime.datetime.now(datetime.timezone.utc),
                                         lifetime=datetime.timedelta(days=90))
            return web.json_response(join_rules.certificate_answer(cert))
        if op in ("notify", "credentials") and request.method == "POST":
            await request.json()
            return web.json_response({})
        return web.json_response({"kind": "Status", "reason": "UnknownOperation"}, status=404)

    async def start(self) -> int:
        served = pki.issue_server_cert(self.ca, [PEER_ENTRANCE], now=datetime.datetime.now(datetime.timezone.utc))
        (self.tmp_path / "entrance.crt").write_text(served.cert_pem)
        (self.tmp_path / "entrance.key").write_text(served.key_pem)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tmp_path / "entrance.crt", self.tmp_path / "entrance.key")
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self.ca.cert_pem)
        app = web.Application()
        app.router.add_route("*", "/peering/v1/{op}", self._op)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(self.runner, sock, ssl_context=context)
        await site.start()
        return sock.getsockname()[1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_an_established_peering_writes_only_what_a_pull_or_a_renewal_changed(api, kube, tmp_path):
    server, _ = api
    peer_ca = pki.create_ca("peer", now=datetime.datetime.now(datetime.timezone.utc))
    clock = FakeClock()
    entrance = PeerEntrance(peer_ca, tmp_path)
    port = await entrance.start()
    closed = f"127.0.0.1:{closed_port()}"
    world = World(server, kube, clock, {"peering-gateway.t.lab": closed, PEER_ENTRANCE: f"127.0.0.1:{port}"})
    await world.start()
    try:
        assert await world.run("certificates", "certificates") == 3
        await world.caught_up()
        ours = creds.secret_values(world.server.get("", "secrets", "peering-ca", NAMESPACE))
        our_ca = pki.CertAndKey(ours["tls.crt"], ours["tls.key"])
        for name, resource, verbs in (("cm", "configmaps", ["get"]), ("nodes", "nodes", ["list"])):
            server.create({"apiVersion": API_VERSION, "kind": "PeeringCapability", "metadata": {"name": name},
                           "spec": {"version": "v1", "consumers": [{"namespace": "d8-m", "name": "ctl"}],
                                    "rules": [{"apiGroups": [""], "resources": [resource], "verbs": verbs}]}})
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
        server.create({"apiVersion": "deckhouse.io/v1alpha2", "kind": "Project", "metadata": {"name": "shop"},
                       "spec": {}})
        cp = server.create({"apiVersion": API_VERSION, "kind": "ClusterPeer", "metadata": {"name": "to-y"},
                            "spec": {"type": "Join", "capabilities": ["cm", "nodes"],
                                     "join": {"connectionString": "d8peer1.used-long-ago"}}})
        # The state a completed join leaves: both certificates, the peer's CA, where it is.
        now = datetime.datetime.now(datetime.timezone.utc)
        mine, theirs = pki.make_key_and_csr(CLUSTER_UUID), pki.make_key_and_csr(PEER_UUID)
        server.create(creds.peer_secret(cp, NAMESPACE, PeerCredentials.from_values({
            "peer-ca.crt": peer_ca.cert_pem, "client.key": mine.key_pem,
            "client.crt": pki.issue_client_cert(peer_ca, mine.cert_pem, CLUSTER_UUID, now=now),
            "issued.crt": pki.issue_client_cert(our_ca, theirs.cert_pem, PEER_UUID, now=now),
            "peer-uuid": PEER_UUID, "peer-entrance": PEER_ENTRANCE})))
        for name in ("cm", "nodes"):
            assert await world.settle("peeringcapability", name) == 1

        # The first pass delivers our certificate, pulls the offer, writes the status and the provider, and
        # announces our offer; the next one finds nothing to do, toward the API or the peer.
        assert await world.run("clusterpeer", "to-y") == 2
        assert entrance.calls == ["credentials", "offer", "notify"]
        status = clusterpeer(world, "to-y")["status"]
        assert (status["phase"], get_condition(status["conditions"], "Ready")["reason"]) == ("Active",
                                                                                               "PeeringReady")
        assert status["effectiveCapabilities"] == ["cm", "nodes"] and status["pairedProjectsCount"] == 1
        assert await world.run("clusterpeer", "to-y") == 0
        assert entrance.calls == ["credentials", "offer", "notify"]

        # What the status entitles to: a Role and its binding in the paired project, a ClusterRole and its
        # binding, the ProjectPeer (created, then its status).
        assert await world.run("grants", "to-y") == 6
        assert await world.run("grants", "to-y") == 0

        # The next pull is due after the sync interval: it learns nothing, so nothing is written.
        clock.advance(40)
        assert await world.run("clusterpeer", "to-y") == 0
        assert entrance.calls[3:] == ["offer"]
        assert await world.run("grants", "to-y") == 0

        # The peer's project gained a namespace: one status write here, the ProjectPeer's status there.
        entrance.offer["projects"] = [{"name": "shop", "namespaces": ["shop", "shop-eu"]}]
        clock.advance(40)
        assert await world.run("clusterpeer", "to-y") == 1
        assert await world.run("clusterpeer", "to-y") == 0
        assert await world.run("grants", "to-y") == 1
        assert await world.run("grants", "to-y") == 0

        # Half into our client certificate's 24 hours it is renewed (the Secret, once) over the peer's
        # /peering/v1/certificate; the pull of that pass changes nothing.
        before = creds.secret_values(server.get("", "secrets", "peer-to-y", NAMESPACE))["client.crt"]
        clock.advance(13 * HOUR)
        assert await world.run("clusterpeer", "to-y") == 1
        assert "certificate" in entrance.calls
        after = creds.secret_values(server.get("", "secrets", "peer-to-y", NAMESPACE))
        assert after["client.crt"] != before and after["client.key"] == mine.key_pem
        assert pki.issued_by(after["client.crt"], peer_ca.cert_pem)
        assert await world.run("clusterpeer", "to-y") == 0
        assert sum(n for (verb, res), n in kube.write_counts.items() if res == "secrets") == 3 + 1
    finally:
        await world.stop()
        await entrance.stop()
