"""Two lab clusters, each with the real `peering run` process: invite, join, and the refusals of a join."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import uuid

import aiohttp
import pytest
import pytest_asyncio

from control import connstring, pki
from control.config import Settings
from control.handlers.join import JoinHandler
from control.kube import KubeSession
from control.process import Context, Handlers
from control.rules import join as join_rules
from control.informers import Informers
from gateway.protocol import JoinCall
from contract.errors import Refusal
from lab.testing import apiserver_backends, lab_clusters
from peering_lab import (GROUP, clusterpeer, connection_string, create_invite, create_join, fast_peering_command,
                                   ready, ready_message, until, until_equal)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=apiserver_backends())
async def lab(request, tmp_path_factory):
    async with lab_clusters(tmp_path_factory.mktemp("lab"), ["a", "b"], peering_command=fast_peering_command,
                            apiserver=request.param) as lab:
        yield lab


async def test_invite_then_join_is_active_and_ready_on_both_sides(lab):
    a, b = lab["a"], lab["b"]
    create_invite(a, "to-b", tokenTTL="1h")
    text = await connection_string(a, "to-b")
    create_join(b, "to-a", text)
    await until_equal(lambda: (*ready(clusterpeer(b, "to-a")), ready_message(clusterpeer(b, "to-a"))),
                      ("Active", "True", "PeeringReady", "the peering works"), timeout=20)
    await until_equal(lambda: (*ready(clusterpeer(a, "to-b")), ready_message(clusterpeer(a, "to-b"))),
                      ("Active", "True", "PeeringReady", "the peering works"), timeout=20)
    a_status, b_status = clusterpeer(a, "to-b")["status"], clusterpeer(b, "to-a")["status"]
    assert a_status["invite"]["used"] is True
    assert a_status["peer"]["alias"] == "to-a" and b_status["peer"]["alias"] == "to-b"
    assert a_status["peer"]["clusterUUID"] == b.info()["uuid"]
    assert b_status["peer"]["clusterUUID"] == a.info()["uuid"]


def _expired_copy(text: str) -> str:
    """The same invitation with an expiry in the past, as a string that passes the format checks."""
    inv = connstring.decode(text, now=datetime.datetime.now(datetime.timezone.utc))
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    return connstring.encode(dataclasses.replace(inv, expires_at=past))


async def _ends_in(cluster, name: str, phase: str, reason: str, timeout: float = 10.0) -> str:
    await until_equal(lambda: ready(clusterpeer(cluster, name))[::2], (phase, reason), timeout=timeout,
                      what=f"{name}: phase {phase}, Ready reason {reason}")
    return ready_message(clusterpeer(cluster, name))


async def test_used_string_ends_in_token_used_within_seconds(lab):
    a, b = lab["a"], lab["b"]
    text = clusterpeer(a, "to-b")["status"]["invite"]["connectionString"]
    create_join(b, "to-a-again", text)
    message = await _ends_in(b, "to-a-again", "Error", "TokenUsed")
    assert "used" in message and text.split(".", 1)[1][:40] not in message


async def test_expired_string_ends_in_expired_before_anything_is_sent(lab):
    a, b = lab["a"], lab["b"]
    create_invite(a, "expired-for-b")
    text = await connection_string(a, "expired-for-b")
    create_join(b, "expired", _expired_copy(text))
    message = await _ends_in(b, "expired", "Error", "Expired")
    assert "expired" in message
    # Nothing reached the inviter: its string is still unused.
    assert clusterpeer(a, "expired-for-b")["status"]["invite"]["used"] is False


async def test_string_for_another_cluster_ends_in_cluster_not_expected(lab):
    a, b = lab["a"], lab["b"]
    create_invite(a, "for-someone-else", expectedClusterUUID=str(uuid.uuid4()))
    text = await connection_string(a, "for-someone-else")
    create_join(b, "not-me", text)
    await _ends_in(b, "not-me", "Error", "ClusterNotExpected")
    assert clusterpeer(a, "for-someone-else")["status"]["invite"]["used"] is False


async def test_joiner_expecting_another_inviter_never_sends_the_token(lab):
    a, b = lab["a"], lab["b"]
    create_invite(a, "pinned")
    text = await connection_string(a, "pinned")
    create_join(b, "pinned", text, expectedClusterUUID=str(uuid.uuid4()))
    message = await _ends_in(b, "pinned", "Error", "ClusterNotExpected")
    assert "not sent" in message
    assert clusterpeer(a, "pinned")["status"]["invite"]["used"] is False


async def test_truncated_string_ends_in_malformed(lab):
    a, b = lab["a"], lab["b"]
    create_invite(a, "truncated")
    text = await connection_string(a, "truncated")
    create_join(b, "truncated", text[:-20])
    message = await _ends_in(b, "truncated", "Error", "Malformed")
    assert "copy it again" in message


def join_body(inv: connstring.Invitation, alias: str) -> dict:
    """A join with `inv`'s token from a new cluster (its own UUID, CA and key), named `alias`."""
    now = datetime.datetime.now(datetime.timezone.utc)
    joiner = str(uuid.uuid4())
    return join_rules.join_request(inv, cluster_uuid=joiner, alias=alias, entrance=f"peering-gateway.{alias}.lab",
                                   ca_pem=pki.create_ca(joiner, now=now).cert_pem,
                                   csr_pem=pki.make_key_and_csr(joiner).cert_pem, offer={})


@contextlib.asynccontextmanager
async def join_handler(cluster, inv: connstring.Invitation):
    """The join handler of `cluster` as every replica runs it (its own session and synced caches, holding `inv`'s
    invite), and its API session."""
    kube = await KubeSession.connect(str(cluster.path("kubeconfig")))
    informers = Informers(kube)
    ctx = Context(Settings(public_domain_template=f"%s.{cluster.name}.lab"), kube, informers, Handlers())
    handler = JoinHandler(ctx)
    ctx.cluster_uuid_informer()
    informers.start()
    try:
        await informers.wait_synced()
        await until(lambda: handler._cached_invite(inv.token_id)[0], what="the invite in the handler's cache")
        yield handler, kube
    finally:
        await informers.stop()
        await kube.close()


class _NotYetSeen:
    """A ClusterPeer cache that has not seen the status write of invite `token_id` yet (every other object as the
    real cache holds it): a real kube-apiserver's watch delivers a write tens of milliseconds after it is stored."""

    def __init__(self, cache, token_id: str) -> None:
        self.cache, self.token_id = cache, token_id

    def items(self):
        return [cp for cp in self.cache.items()
                if ((cp.get("status") or {}).get("invite") or {}).get("tokenID") != self.token_id]

    def __getattr__(self, name):
        return getattr(self.cache, name)


async def test_a_join_the_moment_its_string_is_read_is_accepted_before_the_cache_has_seen_the_invite(lab):
    """The administrator reads the connection string from the API server and the joiner redeems it at once, before
    the inviter's cache holds that invite: on the real backend one such join was refused TokenInvalid, which is final
    for the joiner, and the peering never came. The handler finds the invite in a fresh list."""
    a = lab["a"]
    create_invite(a, "just-issued")
    text = await connection_string(a, "just-issued")
    inv = connstring.decode(text, now=datetime.datetime.now(datetime.timezone.utc))
    async with join_handler(a, inv) as (handler, _):
        handler.clusterpeers = _NotYetSeen(handler.clusterpeers, inv.token_id)
        answer = await handler(JoinCall(body=join_body(inv, "prompt-joiner"), remote="127.0.0.1"))
    assert isinstance(answer, dict) and answer


async def test_fifty_concurrent_joins_with_one_string_exactly_one_wins(lab):
    """The join handler as every replica runs it, against cluster a's API: 50 joiners (distinct clusters and keys)
    race with one string; the resourceVersion precondition lets exactly one mark it used."""
    a = lab["a"]
    create_invite(a, "contested")
    text = await connection_string(a, "contested")
    inv = connstring.decode(text, now=datetime.datetime.now(datetime.timezone.utc))
    async with join_handler(a, inv) as (handler, _):
        bodies = [join_body(inv, f"joiner-{i}") for i in range(50)]

        async def one(body: dict):
            try:
                return await handler(JoinCall(body=body, remote="127.0.0.1"))
            except Refusal as err:
                return err

        results = await asyncio.gather(*(one(b) for b in bodies))
    won = [r for r in results if isinstance(r, dict)]
    lost = [r for r in results if isinstance(r, Refusal)]
    assert len(won) == 1, [getattr(r, "reason", "answer") for r in results]
    assert {(r.code, r.reason) for r in lost} == {(409, "TokenUsed")}
    assert clusterpeer(a, "contested")["status"]["invite"]["used"] is True
    winner = won[0]
    assert winner["clusterUUID"] == a.info()["uuid"] and pki.verify_pin(winner["caBundle"], inv.ca_pin)


async def _guess(port: int, source: str, inv: connstring.Invitation, secret: str) -> tuple[int, str]:
    """A well-formed join with `inv`'s token ID and a wrong `secret`, sent from the loopback address `source`
    straight to the join listener (as from a client of its own behind a trusted Ingress)."""
    body = join_body(dataclasses.replace(inv, token_secret=secret), "guess")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(source, 0))) as http:
        async with http.post(f"http://127.0.0.1:{port}/v1/join", json=body) as r:
            return r.status, (await r.json())["reason"]


async def test_wrong_guesses_at_the_public_token_id_never_stall_the_join(lab):
    """A viewer of a reads status.invite.tokenID; ten wrong joins with it from ten addresses lock that token ID for
    wrong secrets only: b, joining with the string, becomes Active at once and never shows TooManyAttempts."""
    a, b = lab["a"], lab["b"]
    # b peers with a already (the first test): end that peering, or a refuses b's UUID as in use.
    for cluster, name in ((a, "to-b"), (b, "to-a")):
        if clusterpeer(cluster, name) is not None:
            cluster.api.delete(GROUP, "clusterpeers", name)
    await until(lambda: clusterpeer(a, "to-b") is None and clusterpeer(b, "to-a") is None,
                what="the earlier peering gone on both sides")
    create_invite(a, "guessed-at")
    text = await connection_string(a, "guessed-at")
    inv = connstring.decode(text, now=datetime.datetime.now(datetime.timezone.utc))
    assert clusterpeer(a, "guessed-at")["status"]["invite"]["tokenID"] == inv.token_id  # what a viewer reads
    port = a.replicas[0].ports["join"]
    guesses = [await _guess(port, f"127.0.0.{10 + i}", inv, f"wrong-{i}") for i in range(10)]
    assert guesses == [(403, "TokenInvalid")] * 10
    assert await _guess(port, "127.0.0.30", inv, "wrong-again") == (429, "TooManyAttempts")
    create_join(b, "guessed-at", text)
    seen: set[str] = set()

    def state():
        seen.add(ready(clusterpeer(b, "guessed-at"))[2])
        return ready(clusterpeer(b, "guessed-at"))
    await until_equal(state, ("Active", "True", "PeeringReady"), timeout=20)
    assert "TooManyAttempts" not in seen
    assert await _guess(port, "127.0.0.31", inv, "wrong-after") == (429, "TooManyAttempts")


async def test_a_token_id_over_its_limit_is_answered_from_the_cache_alike_for_unknown_and_wrong(lab):
    """Over the limit, a wrong secret and an unknown token ID get the same 429 without a single API read; the
    right secret goes on to the redemption as ever."""
    a = lab["a"]
    create_invite(a, "limited")
    inv = connstring.decode(await connection_string(a, "limited"), now=datetime.datetime.now(datetime.timezone.utc))
    async with join_handler(a, inv) as (handler, kube):
        good = join_body(inv, "j")
        refusals = []
        before = sum(kube.read_counts.values())
        for token in (f"{inv.token_id}.wrong", "nosuchid.wrong", inv.token_id, 5):
            with pytest.raises(Refusal) as err:
                await handler(JoinCall(body={**good, "token": token}, remote="198.51.100.1", token_limited=True))
            refusals.append((err.value.code, err.value.reason, err.value.message))
        assert sum(kube.read_counts.values()) == before
        assert len(set(refusals)) == 1 and refusals[0][:2] == (429, "TooManyAttempts")
        answer = await handler(JoinCall(body=good, remote="198.51.100.2", token_limited=True))
        assert answer["clusterUUID"] == a.info()["uuid"]
    assert clusterpeer(a, "limited")["status"]["invite"]["used"] is True
