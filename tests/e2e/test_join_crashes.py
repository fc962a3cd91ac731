"""A crash at any write of the join loses nothing: the peering process of either side is killed (SIGKILL) right after
each write of the join lands (the claim of the peer's cluster UUID among them), restarted, and the peering ends
Active and Ready on both sides; a redemption that can no longer complete ends in a named reason and a fresh
connection string, and its claim of the joiner's UUID is released.

The kills run on the emulator backend only: the kill points are the emulator's after-write hooks
(lab/apiserver/hooks.py), which run inside the API server right after a write is stored and before its answer
leaves, so the process never reads the answer of the write it made; a real kube-apiserver has no such hook. The
stranded redemption, whose state is written through the API, runs on both backends. The restarted process keeps
its Lease identity (`--identity`), as a container restarted in its Pod does, so it leads again at once instead of
waiting out the dead one's Lease.
"""

from __future__ import annotations

import base64
import datetime
import os
import signal

import pytest
import pytest_asyncio

from contract.names import provider_name, uuid_claim_name
from control import pki, uuid_claim
from control.rules import invite as invite_rules
from lab.apiserver.errors import ApiError
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import (FAST, clusterpeer, connection_string, create_invite, create_join, ready, ready_message,
                         until, until_equal)
from lab.cluster import default_peering_command

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

GROUP = "peering.deckhouse.io"
ACTIVE = ("Active", "True", "PeeringReady")


def _command(cluster) -> list[str] | None:
    cmd = default_peering_command(cluster)
    return None if cmd is None else cmd + FAST + ["--identity", f"lab-{cluster.name}"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(request, tmp_path_factory):
    """Clusters a and b on the backend each test names (`on_emulator`, `on_both`)."""
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=_command,
                            apiserver=request.param) as lab:
        yield lab


# The after-write hooks are the emulator's alone; what is written through the API runs on both backends.
on_emulator = pytest.mark.parametrize("lab", apiserver_backends(("emulator",)), indirect=True)
on_both = pytest.mark.parametrize("lab", apiserver_backends(), indirect=True)


def _status(w) -> dict:
    return (w.obj or {}).get("status") or {}


def _data(w) -> dict:
    return (w.obj or {}).get("data") or {}


INVITER, JOINER = "a", "b"
UPDATE = ("update", "patch")
#: (the write after which the process of `side` is killed: verbs, resource, whose object, and what it holds).
#: `inv` stands for the Invite ClusterPeer on a, `join` for the Join ClusterPeer on b, `claim-of-<side>` for the
#: claim Lease of that side's cluster UUID (held on the other side).
KILL_POINTS = {
    "inviter: the claim of the joiner's UUID": (INVITER, ("create",), "leases", f"claim-of-{JOINER}", None),
    "inviter: the token marked used with its redeemer": (
        INVITER, UPDATE, "clusterpeers/status", "inv", lambda w: (_status(w).get("invite") or {}).get("used") is True),
    "inviter: the peer Secret of the redemption": (INVITER, ("create", "update"), "secrets", "peer-inv", None),
    "inviter: the joiner's certificate for our key stored": (
        INVITER, UPDATE, "secrets", "peer-inv", lambda w: "client.crt" in _data(w)),
    "inviter: Active written": (
        INVITER, UPDATE, "clusterpeers/status", "inv", lambda w: _status(w).get("phase") == "Active"),
    "joiner: the key stored before the call": (JOINER, ("create",), "secrets", "peer-join", None),
    "joiner: the claim of the inviter's UUID": (JOINER, ("create",), "leases", f"claim-of-{INVITER}", None),
    "joiner: the answer stored": (JOINER, UPDATE, "secrets", "peer-join", lambda w: "client.crt" in _data(w)),
    "joiner: status.peer written": (
        JOINER, UPDATE, "clusterpeers/status", "join", lambda w: bool(_status(w).get("peer"))),
    "joiner: Active written": (
        JOINER, UPDATE, "clusterpeers/status", "join", lambda w: _status(w).get("phase") == "Active"),
}


async def _restart_after_kill(cluster, hook) -> None:
    await until(lambda: hook.fired, timeout=60, what="the write the kill point names")
    await cluster.stop_replica(0, signal.SIGKILL)  # already killed by the hook: this reaps it
    await cluster.start_replica(0)


async def _delete_both(a, b, inv: str, join: str) -> None:
    for cluster, name in ((a, inv), (b, join)):
        if clusterpeer(cluster, name) is not None:
            cluster.api.delete(GROUP, "clusterpeers", name)
    await until(lambda: clusterpeer(a, inv) is None and clusterpeer(b, join) is None
                and a.api.get("", "secrets", f"peer-{inv}", "d8-peering") is None
                and b.api.get("", "secrets", f"peer-{join}", "d8-peering") is None
                and _claim(a, b) is None and _claim(b, a) is None,
                timeout=30, what="both ClusterPeers, their Secrets and their claims gone")


def _claim(cluster, peer) -> dict | None:
    """`cluster`'s claim of `peer`'s cluster UUID."""
    return cluster.api.get("coordination.k8s.io", "leases", uuid_claim_name(peer.info()["uuid"]), "d8-peering")


@on_emulator
@pytest.mark.parametrize("point", list(KILL_POINTS))
async def test_a_crash_after_each_write_of_the_join_ends_active_on_both_sides(lab, point):
    a, b = lab["a"], lab["b"]
    side, verbs, resource, whose, when = KILL_POINTS[point]
    slug = str(list(KILL_POINTS).index(point))
    inv, join = f"inv-{slug}", f"join-{slug}"
    if whose.startswith("claim-of-"):
        name = uuid_claim_name(lab[whose.removeprefix("claim-of-")].info()["uuid"])
    else:
        name = whose.replace("inv", inv) if whose.endswith("inv") else whose.replace("join", join)
    victim = lab[side]

    def kill(write) -> None:
        os.kill(victim.process.pid, signal.SIGKILL)

    hook = victim.api.write_hooks.after(verbs, resource, name, kill, when=when)
    try:
        create_invite(a, inv, tokenTTL="1h")
        text = await connection_string(a, inv)
        create_join(b, join, text)
        await _restart_after_kill(victim, hook)
        try:
            await until_equal(lambda: ready(clusterpeer(b, join)), ACTIVE, timeout=90, what=f"{join} on b Active")
            await until_equal(lambda: ready(clusterpeer(a, inv)), ACTIVE, timeout=90, what=f"{inv} on a Active")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; b says {ready_message(clusterpeer(b, join))!r}, a says "
                                 f"{ready_message(clusterpeer(a, inv))!r}") from None
        a_cp, b_cp = clusterpeer(a, inv), clusterpeer(b, join)
        # The invite names its redeemer: b's UUID and the key a's certificate for b was issued to.
        redeemer = a_cp["status"]["invite"]["redeemer"]
        issued = base64.b64decode(a.api.get("", "secrets", f"peer-{inv}", "d8-peering")["data"]["issued.crt"])
        assert redeemer["clusterUUID"] == b.info()["uuid"]
        assert redeemer["keyFingerprint"] == pki.public_key_fingerprint(issued.decode())
        # b's client certificate from a is for the key b stored before the call, whatever crashed meanwhile.
        b_values = b.api.get("", "secrets", f"peer-{join}", "d8-peering")["data"]
        b_key_fp = pki.public_key_fingerprint(pki.csr_for_key(base64.b64decode(b_values["client.key"]).decode(),
                                                              b.info()["uuid"]))
        assert pki.public_key_fingerprint(base64.b64decode(b_values["client.crt"]).decode()) == b_key_fp
        assert a_cp["status"]["peer"]["clusterUUID"] == b.info()["uuid"]
        assert b_cp["status"]["peer"]["clusterUUID"] == a.info()["uuid"]
        # Each side's claim of the peer's UUID is held by its ClusterPeer of this peering, whatever crashed.
        for cluster, cp, peer in ((a, a_cp, b), (b, b_cp, a)):
            claim = _claim(cluster, peer)
            assert [r["uid"] for r in claim["metadata"]["ownerReferences"]] == [cp["metadata"]["uid"]]
        # Each side's provider names the peer by the identity this side assigned: its own ClusterPeer's uid.
        for cluster, cp in ((a, a_cp), (b, b_cp)):
            provider = await until(lambda: cluster.api.get("deckhouse.io", "tokenexchangeproviders",
                                                           provider_name(cp["metadata"]["name"])),
                                   what="the TokenExchangeProvider")
            assert provider["spec"]["usernamePrefix"] == f"peering:{cp['metadata']['uid']}:"
    finally:
        victim.api.write_hooks.clear()
        if victim.process is None:
            await victim.start_replica(0)
        await _delete_both(a, b, inv, join)


@on_both
async def test_a_stranded_redemption_met_by_another_key_is_reissued_with_its_reason(lab):
    """The inviter crashed after marking the token used and before the Secret, and the joiner then came back with
    another key (its ClusterPeer re-created): that redemption can never complete. The state the crash leaves is
    written directly, as redeemed by the lost key long enough ago to count as cut short rather than under way
    (control/handlers/join.py STRANDED_AFTER): the join with the other key is TokenUsed, the inviter issues a
    fresh string with Ready reason RedeemedWithAnotherKey, and a join with that string ends Active."""
    a, b = lab["a"], lab["b"]
    create_invite(a, "stranded", tokenTTL="1h")
    text = await connection_string(a, "stranded")
    lost_key = pki.make_key_and_csr(b.info()["uuid"])
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    # The redemption the crash cut short had claimed b's UUID first.
    a.api.create(uuid_claim.claim_object(clusterpeer(a, "stranded"), "d8-peering", b.info()["uuid"]))

    def strand() -> bool:
        cp = clusterpeer(a, "stranded")
        used = invite_rules.mark_used(cp["status"]["invite"], invite_rules.Redeemer(
            b.info()["uuid"], pki.public_key_fingerprint(lost_key.cert_pem)), long_ago)
        try:
            a.api.update({**cp, "status": {**cp["status"], "invite": used}}, subresource="status")
        except ApiError as exc:
            if exc.code != 409:
                raise
            return False  # the reconciler wrote meanwhile: read again
        return True
    await until(strand, what="the stranded redemption written")
    try:
        create_join(b, "again", text)
        await until_equal(lambda: ready(clusterpeer(b, "again"))[::2], ("Error", "TokenUsed"), timeout=30)
        assert "RedeemedWithAnotherKey" in ready_message(clusterpeer(b, "again"))
        await until_equal(lambda: ready(clusterpeer(a, "stranded")), ("Pending", "False", "RedeemedWithAnotherKey"),
                          timeout=30)
        # The re-issue released the claim of the redemption it replaced.
        assert _claim(a, b) is None
        message = ready_message(clusterpeer(a, "stranded"))
        assert b.info()["uuid"] in message and "new connection string" in message
        fresh = clusterpeer(a, "stranded")["status"]["invite"]
        assert fresh["used"] is False and fresh["connectionString"] != text
        assert fresh["reissue"]["reason"] == "RedeemedWithAnotherKey"
        b.api.delete(GROUP, "clusterpeers", "again")
        await until(lambda: clusterpeer(b, "again") is None, what="the refused ClusterPeer gone")
        # Made again at once under the same name: its join is a new one, whatever the last one left behind.
        create_join(b, "again", fresh["connectionString"])
        try:
            await until_equal(lambda: ready(clusterpeer(b, "again")), ACTIVE, timeout=60, what="again on b Active")
            await until_equal(lambda: ready(clusterpeer(a, "stranded")), ACTIVE, timeout=60, what="stranded Active")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; b says {ready_message(clusterpeer(b, 'again'))!r}, a says "
                                 f"{ready_message(clusterpeer(a, 'stranded'))!r}") from None
        assert "reissue" not in clusterpeer(a, "stranded")["status"]["invite"]
    finally:
        await _delete_both(a, b, "stranded", "again")


@on_emulator
async def test_a_joiner_that_gives_up_after_the_answer_leaves_a_fresh_string_not_a_hang(lab):
    """b is stopped right after a stored its answer, so b never stores it, and b's administrator gives up (deletes
    the ClusterPeer). a waits for b's half of the exchange until the string's TTL after the redemption (reached
    here by writing the redemption's time back), then drops the Secret of that exchange, with the certificate it
    holds for b, and issues a fresh string with Ready reason JoinAbandoned; a join with it ends Active."""
    a, b = lab["a"], lab["b"]

    def stop_b(write) -> None:
        os.kill(b.process.pid, signal.SIGKILL)

    hook = a.api.write_hooks.after(("create", "update"), "secrets", "peer-gave-up", stop_b)
    try:
        create_invite(a, "gave-up", tokenTTL="1h")
        text = await connection_string(a, "gave-up")
        create_join(b, "left", text)
        await until(lambda: hook.fired, timeout=60, what="a's Secret of the redemption")
        await b.stop_replica(0, signal.SIGKILL)
        b.api.delete(GROUP, "clusterpeers", "left")
        await until_equal(lambda: ready(clusterpeer(a, "gave-up")), ("Pending", "False", "CredentialsPending"))
        long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=2)

        def backdate() -> bool:
            cp = clusterpeer(a, "gave-up")
            invite = cp["status"]["invite"]
            redeemer = {**invite["redeemer"], "redeemedAt": long_ago.strftime("%Y-%m-%dT%H:%M:%SZ")}
            try:
                a.api.update({**cp, "status": {**cp["status"], "invite": {**invite, "redeemer": redeemer}}},
                             subresource="status")
            except ApiError as exc:
                if exc.code != 409:
                    raise
                return False
            return True
        await until(backdate, what="the redemption's time written back")
        await until_equal(lambda: ready(clusterpeer(a, "gave-up")), ("Pending", "False", "JoinAbandoned"), timeout=30)
        assert a.api.get("", "secrets", "peer-gave-up", "d8-peering") is None
        assert _claim(a, b) is None  # the claim of the abandoned redemption went before the fresh string
        fresh = clusterpeer(a, "gave-up")["status"]["invite"]
        assert fresh["used"] is False and fresh["connectionString"] != text
        assert fresh["reissue"]["reason"] == "JoinAbandoned" and b.info()["uuid"] in fresh["reissue"]["message"]
        await b.start_replica(0)
        create_join(b, "back", fresh["connectionString"])
        await until_equal(lambda: ready(clusterpeer(b, "back")), ACTIVE, timeout=60, what="back on b Active")
        await until_equal(lambda: ready(clusterpeer(a, "gave-up")), ACTIVE, timeout=60, what="gave-up on a Active")
    finally:
        a.api.write_hooks.clear()
        if b.process is None:
            await b.start_replica(0)
        if clusterpeer(b, "left") is not None:
            b.api.delete(GROUP, "clusterpeers", "left")
        await _delete_both(a, b, "gave-up", "back")
