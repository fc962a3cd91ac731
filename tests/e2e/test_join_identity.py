"""An identity cannot be claimed: the original attack, a second invited cluster claiming the UUID of a's first peer,
is refused at the join (ClusterUUIDInUse), and the identity the grants and the exchanged username use is a's own
ClusterPeer's uid, which no join can choose.

Two lab clusters, on each backend: the control loop's join handler (the code every replica runs for `POST /v1/join`)
is driven in this process against a's API server, beside a's own peering process."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import pytest
import pytest_asyncio

from contract.errors import Refusal
from contract.names import NAMESPACE, provider_name, uuid_claim_name
from control import connstring, pki
from control.config import Settings
from control.handlers.join import JoinHandler
from control.informers import Informers
from control.kube import KubeSession
from control.process import Context, Handlers
from control.rules import join as join_rules
from gateway.protocol import JoinCall
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import (GROUP, clusterpeer, connection_string, create_invite, create_join, fast_peering_command, ready,
                         until, until_equal)

pytestmark = pytest.mark.asyncio(loop_scope="module")
ACTIVE = ("Active", "True", "PeeringReady")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=fast_peering_command,
                            apiserver=request.param) as lab:
        a, b = lab["a"], lab["b"]
        create_invite(a, "to-b", tokenTTL="1h")
        create_join(b, "to-a", await connection_string(a, "to-b"))
        await until_equal(lambda: ready(clusterpeer(b, "to-a")), ACTIVE, timeout=30)
        await until_equal(lambda: ready(clusterpeer(a, "to-b")), ACTIVE, timeout=30)
        yield lab


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def handler(lab):
    """a's join handler, as every replica of a runs it, with its caches synced."""
    a = lab["a"]
    kube = await KubeSession.connect(str(a.path("kubeconfig")))
    informers = Informers(kube)
    ctx = Context(Settings(public_domain_template="%s.a.lab"), kube, informers, Handlers())
    join = JoinHandler(ctx)
    ctx.cluster_uuid_informer()
    informers.start()
    try:
        await informers.wait_synced()
        yield join
    finally:
        await informers.stop()
        await kube.close()


def _body(inv, *, cluster_uuid: str, entrance: str = "peering-gateway.evil.lab", token: str | None = None) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    body = join_rules.join_request(inv, cluster_uuid=cluster_uuid, alias="to-a", entrance=entrance,
                                   ca_pem=pki.create_ca("evil", now=now).cert_pem,
                                   csr_pem=pki.make_key_and_csr(cluster_uuid[:36]).cert_pem, offer={})
    if token is not None:
        body["token"] = token
    return body


async def _refusal(handler, body) -> Refusal:
    with pytest.raises(Refusal) as err:
        await handler(JoinCall(body=body, remote="127.0.0.1"))
    return err.value


async def test_a_second_invited_cluster_claiming_the_first_peers_uuid_is_refused(lab, handler):
    a, b = lab["a"], lab["b"]
    create_invite(a, "to-evil", tokenTTL="1h")
    text = await connection_string(a, "to-evil")
    inv = connstring.decode(text, now=datetime.datetime.now(datetime.timezone.utc))
    await until(lambda: handler._cached_invite(inv.token_id)[0], what="the invite in the handler's cache")
    b_uuid = b.info()["uuid"]

    # Without the secret, nothing tells whether the UUID is in use.
    wrong = await _refusal(handler, _body(inv, cluster_uuid=b_uuid, token=f"{inv.token_id}.{'x' * 43}"))
    assert (wrong.code, wrong.reason) == (403, "TokenInvalid")
    # With it: b's UUID is the live peering to-b's; a's own is a's. Either in any case of letters.
    for claimed in (b_uuid, b_uuid.upper(), a.info()["uuid"]):
        refused = await _refusal(handler, _body(inv, cluster_uuid=claimed))
        assert (refused.code, refused.reason) == (409, "ClusterUUIDInUse"), refused.message
        assert claimed in refused.message and inv.token_secret not in refused.message
    assert "to-b" in (await _refusal(handler, _body(inv, cluster_uuid=b_uuid))).message
    # A claim that is not a UUID, and an entrance that is more than a host, are malformed, naming the field.
    not_uuid = await _refusal(handler, _body(inv, cluster_uuid="peering:" + b_uuid[:27]))
    assert (not_uuid.code, not_uuid.reason) == (400, "Malformed") and "clusterUUID" in not_uuid.message
    for entrance in ("peering-gateway.evil.lab/peering/v1", "user@peering-gateway.evil.lab",
                     "https://peering-gateway.evil.lab", "10.0.0.1:443?x"):
        bad = await _refusal(handler, _body(inv, cluster_uuid=str(uuid.uuid4()), entrance=entrance))
        assert (bad.code, bad.reason) == (400, "Malformed") and "entrance" in bad.message, entrance
    # None of it used the string: it is still there for the cluster it was meant for.
    assert clusterpeer(a, "to-evil")["status"]["invite"]["used"] is False
    assert clusterpeer(a, "to-b")["status"]["peer"]["clusterUUID"] == b_uuid


class _Frozen:
    """An informer's cache as it was when made: the writes of the joins under test never reach it."""

    def __init__(self, informer) -> None:
        self._store = dict(informer.store)

    def get(self, name: str, namespace: str | None = None) -> dict | None:
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def items(self) -> list[dict]:
        return list(self._store.values())


async def test_of_two_concurrent_redemptions_by_one_cluster_exactly_one_is_accepted(lab, handler):
    """One cluster redeems two of a's strings at once, through replicas whose caches see neither redemption: the
    cache check passes for both, the claim of its UUID lets one through; the other is ClusterUUIDInUse naming
    the first, and its string stays unused."""
    a = lab["a"]
    names = ("race-1", "race-2")
    for name in names:
        create_invite(a, name, tokenTTL="1h")
    try:
        now = datetime.datetime.now(datetime.timezone.utc)
        invs = [connstring.decode(await connection_string(a, name), now=now) for name in names]
        await until(lambda: all(handler._cached_invite(inv.token_id)[0] for inv in invs)
                    and all(clusterpeer(a, name)["status"].get("offer") for name in names),
                    what="both invites, with their offers, in the handler's cache")
        stale = JoinHandler(handler.ctx)
        stale.clusterpeers, stale.secrets = _Frozen(handler.clusterpeers), _Frozen(handler.secrets)
        joiner = str(uuid.uuid4())
        results = await asyncio.gather(*(stale(JoinCall(body=_body(inv, cluster_uuid=joiner), remote="127.0.0.1"))
                                         for inv in invs), return_exceptions=True)
        accepted = [name for name, r in zip(names, results) if isinstance(r, dict)]
        refused = [r for r in results if isinstance(r, Refusal)]
        assert len(accepted) == 1 and len(refused) == 1, results
        assert (refused[0].code, refused[0].reason) == (409, "ClusterUUIDInUse")
        assert f"ClusterPeer {accepted[0]}" in refused[0].message and joiner in refused[0].message
        lost = next(name for name in names if name != accepted[0])
        assert clusterpeer(a, lost)["status"]["invite"]["used"] is False
        assert clusterpeer(a, accepted[0])["status"]["invite"]["redeemer"]["clusterUUID"] == joiner
        claim = a.api.get("coordination.k8s.io", "leases", uuid_claim_name(joiner), NAMESPACE)
        assert claim["spec"]["holderIdentity"] == accepted[0]
    finally:
        for name in names:
            a.api.delete(GROUP, "clusterpeers", name)
    # The claim goes with its ClusterPeer (garbage collection of what it owns).
    await until(lambda: a.api.get("coordination.k8s.io", "leases", uuid_claim_name(joiner), NAMESPACE) is None,
                timeout=30, what="the claim collected with its ClusterPeer")


async def test_the_prefix_of_each_side_is_its_own_clusterpeers_uid(lab):
    a, b = lab["a"], lab["b"]
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        cp = clusterpeer(cluster, name)
        provider = await until(lambda: cluster.api.get("deckhouse.io", "tokenexchangeproviders", provider_name(name)),
                               what=f"the TokenExchangeProvider of {name}")
        assert provider["spec"]["usernamePrefix"] == f"peering:{cp['metadata']['uid']}:"
        assert cp["status"]["peer"]["clusterUUID"] not in provider["spec"]["usernamePrefix"]


async def test_the_joiner_refuses_a_string_naming_itself_before_sending_anything(lab):
    b = lab["b"]
    create_invite(b, "self")
    text = await connection_string(b, "self")
    create_join(b, "to-self", text)
    await until_equal(lambda: ready(clusterpeer(b, "to-self"))[::2], ("Error", "ClusterUUIDInUse"))
    assert clusterpeer(b, "self")["status"]["invite"]["used"] is False
