"""Outages of 3 and 30 days on a fake clock, through the renewal logic of both sides: two clusters, each the
reconcilers of one process (test_idempotency's World) on its own emulated API server, each reached through an
entrance stand-in made of the gateway's own parts: its TLS context (which leaves a client certificate's dates to
admission), `admission.admit_peer_call` judging those dates at the fake clock's time over the registry built from
the cluster's objects, and the cluster's own peer handlers behind it (which issue certificates on the fake clock).

One side (or both) goes away, its process and its entrance, for longer than every client certificate lasts; the
side that stays says so (PeerUnreachable, the certificate expired meanwhile and is renewed when the peer is back),
writing only when that changes. When the side comes back (a new process: nothing in memory), each side renews its
expired certificate at the other's entrance in its first pass after the other is reachable, is Ready again, and
records one Event saying how long the peer was away."""

from __future__ import annotations

import datetime
import hashlib
import types

import pytest
from aiohttp import web

from contract.errors import Refusal
from contract.names import MANAGED_BY_SELECTOR
from contract.paths import PEER_PREFIX
from contract.peer_secret import PeerCredentials
from control import pki
from control.connstring import format_time
from control.feed import build_registry
from control.kube import CLUSTERPEERS, CONFIGMAPS, EVENTS, SECRETS, KubeSession
from control.rules import credentials as creds
from control.rules.conditions import get_condition
from control.selfcheck import CONFIRM_SECONDS, RETRY_SECONDS
from gateway.admission import ClientState, admit_peer_call
from gateway.config import Limits
from gateway.protocol import PeerCall
from gateway.tls import server_context
from tests.control.conftest import CLUSTER_UUID, NAMESPACE, FakeClock, start_api
from tests.control.reconcilers.test_idempotency import API_VERSION, DAY, HOUR, World
from tests.ports import ReservedPort, closed_port

B_UUID = "7c5e0000-0000-4000-8000-0000000000b2"
ENTRANCES = {"a": "peering-gateway.a.lab", "b": "peering-gateway.b.lab"}
NAMES = {"a": "to-b", "b": "to-a"}  # each side's ClusterPeer for the other


class Entrance:
    """A cluster's entrance as the other cluster meets it, on the fake clock (see the module's docstring). Its
    port stays the same across a stop and a start, as a Service's address does."""

    def __init__(self, kube: KubeSession, clock: FakeClock, host: str) -> None:
        self.kube = kube
        self.clock = clock
        self.host = host
        self.world: World | None = None
        # The entrance goes away and comes back on the same port; between, a connection is refused.
        self.reserved = ReservedPort()
        self.port = self.reserved.port
        self.runner: web.AppRunner | None = None

    async def start(self, world: World) -> None:
        self.world = world
        ca = creds.secret_values(await self.kube.get(SECRETS, "peering-ca", NAMESPACE))
        # The caller's TLS judges the server certificate on the machine's clock: issued on that one.
        served = pki.issue_server_cert(pki.CertAndKey(ca["tls.crt"], ca["tls.key"]), [self.host],
                                       now=datetime.datetime.now(datetime.timezone.utc))
        context = server_context(served.cert_pem.encode(), served.key_pem.encode(), ca["tls.crt"].encode())
        app = web.Application()
        app.router.add_route("*", PEER_PREFIX + "{op}", self._call)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        sock = self.reserved.listener()
        try:
            await web.SockSite(self.runner, sock, ssl_context=context).start()
        except BaseException:
            sock.close()
            raise

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _call(self, request: web.Request) -> web.Response:
        assert self.world is not None
        der = request.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        clusterpeers = (await self.kube.list(CLUSTERPEERS))["items"]
        secrets = (await self.kube.list(SECRETS, NAMESPACE, label_selector=MANAGED_BY_SELECTOR))["items"]
        configmap = await self.kube.get(CONFIGMAPS, "d8-cluster-uuid", "kube-system")
        state = types.SimpleNamespace(registry=build_registry(configmap=configmap, clusterpeers=clusterpeers,
                                                              secrets=secrets, capabilities=[], generation=1),
                                      limits=Limits(registry_catch_up=0))
        try:
            peer, op = admit_peer_call(state, ClientState(), hashlib.sha256(der).hexdigest(),  # type: ignore[misc]
                                       request.method, request.path, now=self.clock.now().timestamp())
            body = await request.json() if request.method == "POST" else None
            answer = await self.world.ctx.handlers.peer_call(PeerCall(peer=peer, op=op, body=body))
        except Refusal as refusal:
            return web.json_response({"kind": "Status", "code": refusal.code, "reason": refusal.reason,
                                      "message": refusal.message}, status=refusal.code)
        return web.json_response(answer)


class Pair:
    """Clusters a (the inviter, ClusterPeer `to-b`) and b (the joiner, `to-a`), established on the fake clock."""

    def __init__(self, apis: dict, kubes: dict, clock: FakeClock) -> None:
        self.apis, self.kubes, self.clock = apis, kubes, clock
        self.entrances = {side: Entrance(kubes[side], clock, ENTRANCES[side]) for side in "ab"}
        self.worlds: dict[str, World] = {}

    def resolve(self) -> dict[str, str]:
        closed = f"127.0.0.1:{closed_port()}"
        return {"peering-gateway.t.lab": closed, **{ENTRANCES[s]: f"127.0.0.1:{e.port}"
                                                    for s, e in self.entrances.items()}}

    async def up(self, side: str) -> None:
        """Start the process of `side` anew (nothing in memory) and its entrance."""
        # It leads: its Events are written (the process's Lease holder is the one that records them).
        world = World(self.apis[side], self.kubes[side], self.clock, self.resolve(),
                      controller=types.SimpleNamespace(leading=True, runners=()))
        await world.start()
        await world.settle("certificates", "certificates")
        self.worlds[side] = world
        await self.entrances[side].start(world)

    async def down(self, side: str) -> None:
        await self.entrances[side].stop()
        await self.worlds.pop(side).stop()

    async def establish(self) -> None:
        """What a completed join leaves on both sides, with certificates issued now by each side's CA."""
        now = self.clock.now()
        cas = {s: creds.secret_values(self.apis[s].get("", "secrets", "peering-ca", NAMESPACE)) for s in "ab"}
        uuids = {"a": CLUSTER_UUID, "b": B_UUID}
        keys = {s: pki.make_key_and_csr(uuids[s]) for s in "ab"}
        # The certificate each side's CA issued to the other side's key: held by the one, known to the other.
        issued = {s: pki.issue_client_cert(pki.CertAndKey(cas[s]["tls.crt"], cas[s]["tls.key"]),
                                           keys[o].cert_pem, uuids[o], now=now) for s, o in (("a", "b"), ("b", "a"))}
        for side, other in (("a", "b"), ("b", "a")):
            spec = {"type": "Invite"} if side == "a" else {"type": "Join",
                                                           "join": {"connectionString": "d8peer1.used-long-ago"}}
            cp = self.apis[side].create({"apiVersion": API_VERSION, "kind": "ClusterPeer",
                                         "metadata": {"name": NAMES[side]}, "spec": spec})
            self.apis[side].create(creds.peer_secret(cp, NAMESPACE, PeerCredentials.from_values({
                "peer-ca.crt": cas[other]["tls.crt"], "client.key": keys[side].key_pem,
                "client.crt": issued[other], "issued.crt": issued[side],
                "peer-uuid": uuids[other], "peer-entrance": ENTRANCES[other]})))

    async def passes(self, *sides: str) -> None:
        """One pass of each side's ClusterPeer reconciler, in order."""
        for side in sides:
            await self.worlds[side].run("clusterpeer", NAMES[side])

    async def writes(self, side: str) -> int:
        """The writes of one pass of `side` to anything but Events."""
        kube = self.kubes[side]
        before = {k: n for k, n in kube.write_counts.items() if k[1] != "events"}
        await self.worlds[side].run("clusterpeer", NAMES[side])
        return sum(n for k, n in kube.write_counts.items() if k[1] != "events") - sum(before.values())

    async def settle(self, side: str) -> None:
        """Passes of `side` until one writes nothing, and the next one neither."""
        for _ in range(3):
            if await self.writes(side) == 0:
                break
        assert await self.writes(side) == 0, f"{side} keeps writing"

    def ready(self, side: str) -> dict:
        status = self.apis[side].get("peering.deckhouse.io", "clusterpeers", NAMES[side])["status"]
        return {**get_condition(status["conditions"], "Ready"), "phase": status["phase"]}

    def client_cert(self, side: str) -> str:
        return creds.secret_values(self.apis[side].get("", "secrets", f"peer-{NAMES[side]}", NAMESPACE))["client.crt"]

    async def renewal_events(self, side: str) -> list[str]:
        listed = await self.kubes[side].list(EVENTS, "default")
        return [e.get("note", "") for e in listed["items"] if e.get("reason") == "CertificateRenewed"
                and (e.get("regarding") or {}).get("name") == NAMES[side]]


@pytest.fixture
async def pair(api, kube, tmp_path):
    server_b, kubeconfig_b = await start_api(tmp_path / "b")
    configmap = server_b.get("", "configmaps", "d8-cluster-uuid", "kube-system")
    server_b.update({**configmap, "data": {"cluster-uuid": B_UUID}})
    try:
        async with await KubeSession.connect(str(kubeconfig_b)) as kube_b:
            p = Pair({"a": api[0], "b": server_b}, {"a": kube, "b": kube_b}, FakeClock())
            try:
                for side in "ab":
                    await p.up(side)
                await p.establish()
                for _ in range(3):  # a delivery, a first pull, the offers written on both sides
                    await p.passes("a", "b")
                # The self-check finds no entrance of its own here: confirmed once, so it writes nothing later.
                for seconds in (RETRY_SECONDS, 2 * RETRY_SECONDS, CONFIRM_SECONDS):
                    p.clock.advance(seconds)
                    await p.passes("a", "b")
                for side in "ab":
                    await p.settle(side)
                    assert (p.ready(side)["reason"], p.ready(side)["status"]) == ("PeeringReady", "True"), \
                        p.ready(side)
                yield p
            finally:
                for side in list(p.worlds):
                    await p.down(side)
    finally:
        await server_b.stop()


@pytest.mark.parametrize("days", [3, 30])
@pytest.mark.parametrize("away", ["b", "a", "both"])
async def test_an_outage_longer_than_every_certificate_ends_by_itself(pair, days, away):
    gone = ["a", "b"] if away == "both" else [away]
    stays = [s for s in "ab" if s not in gone]
    held = {s: pair.client_cert(s) for s in "ab"}
    for side in gone:
        await pair.down(side)
    # Within the certificates' lifetime: unreachable, nothing else to say.
    pair.clock.advance(13 * HOUR)
    await pair.passes(*stays)
    for side in stays:
        ready = pair.ready(side)
        assert (ready["phase"], ready["status"], ready["reason"]) == ("Active", "False", "PeerUnreachable")
        assert "expired" not in ready["message"]
    # Past them: the message says the certificate expired meanwhile and is renewed when the peer is back; it is
    # written once, and the passes after it write nothing.
    pair.clock.advance(days * DAY - 13 * HOUR)
    for side in stays:
        assert await pair.writes(side) == 1
        message = pair.ready(side)["message"]
        assert "expired meanwhile" in message and "renewed over the peering as soon as the peer answers" in message
        pair.clock.advance(HOUR)
        assert await pair.writes(side) == 0
        assert pair.client_cert(side) == held[side]
    # Back (a new process each, nothing in memory): one pass of each side once the other is reachable again.
    for side in gone:
        await pair.up(side)
    back = pair.clock.now()
    await pair.passes(*gone, *stays)
    renewed = {s: pair.client_cert(s) for s in "ab"}
    for side in "ab":
        ready = pair.ready(side)
        assert (ready["phase"], ready["status"], ready["reason"]) == ("Active", "True", "PeeringReady"), (side, ready)
        assert renewed[side] != held[side] and pki.valid_at(renewed[side], back)
        assert pki.public_key_fingerprint(renewed[side]) == pki.public_key_fingerprint(held[side])
        (note,) = [n for n in await pair.renewal_events(side) if "after an outage" in n]
        assert f"expired at {format_time(pki.not_after(held[side]))}" in note
        if side in stays:
            # The side that stayed knows its last successful sync: away for the whole outage.
            assert f"away for {days}d" in note and "the last successful sync" in note
        else:
            assert "the last contact this cluster recorded before its own restart" in note
    # Nothing more to write on either side, and the renewed certificates are due only at their half.
    for side in "ab":
        await pair.settle(side)
    pair.clock.advance(11 * HOUR)
    for side in "ab":
        assert await pair.writes(side) == 0
        assert pair.client_cert(side) == renewed[side]


class _PeerPassAfterRenewal:
    """A's client to the peer, with one interleaving: the peer's pass runs after the peer answered a's renewal and
    before a stores the answer. A joiner back from a restart delivers the certificate it issued last, which is the
    one that answer carries: a's handlers store it first."""

    def __init__(self, client, peer_pass) -> None:
        self.client, self.peer_pass, self.crossed = client, peer_pass, 0

    async def call(self, entrance, op, **kwargs):
        answer = await self.client.call(entrance, op, **kwargs)
        if op == "certificate" and answer.ok and not self.crossed:
            self.crossed += 1
            await self.peer_pass()
        return answer

    def __getattr__(self, name):
        return getattr(self.client, name)


async def test_the_renewal_after_an_outage_is_told_once_when_the_peers_delivery_of_it_lands_first(pair):
    held = pair.client_cert("a")
    await pair.down("b")
    pair.clock.advance(3 * DAY)
    await pair.passes("a")
    assert "expired meanwhile" in pair.ready("a")["message"]
    await pair.up("b")
    syncer = pair.worlds["a"].reconcilers["clusterpeer"].syncer
    syncer.client = _PeerPassAfterRenewal(syncer.client, lambda: pair.passes("b"))
    await pair.passes("a")
    assert syncer.client.crossed == 1
    renewed = pair.client_cert("a")
    assert renewed != held and pki.valid_at(renewed, pair.clock.now())
    await pair.passes("a", "b", "a")
    (note,) = [n for n in await pair.renewal_events("a") if "after an outage" in n]
    assert "away for 3d" in note and "the last successful sync" in note
    assert (pair.ready("a")["reason"], pair.ready("a")["status"]) == ("PeeringReady", "True")
