"""What a TokenReview answer grants at the egress (gateway/tokenreview.py), without an API server."""

from __future__ import annotations

import json

import pytest

from contract.errors import Refusal
from gateway.tokenreview import review_audiences, review_body, reviewed_capabilities
from tests.gateway.support import PEER_UUID, registry_for

AUD = f"peering.deckhouse.io/{PEER_UUID}/read-pods"


@pytest.fixture
def registry(pki, issuer_key):
    return registry_for(pki, issuer_key, effective=("read-pods", "write-secrets"))


def answer(authenticated=True, username="system:serviceaccount:mod:controller", audiences=(AUD,)) -> dict:
    return {"status": {"authenticated": authenticated, "user": {"username": username}, "audiences": list(audiences)}}


def test_the_review_asks_for_the_peers_audiences_of_each_effective_capability(registry):
    audiences = review_audiences(registry.peers["peer"])
    assert audiences == {AUD: "read-pods", f"peering.deckhouse.io/{PEER_UUID}/write-secrets": "write-secrets"}
    assert json.loads(review_body("tok", audiences))["spec"] == {"token": "tok", "audiences": list(audiences)}


def test_a_consumer_is_granted_the_capabilities_its_token_and_the_consumers_list_allow(registry):
    peer = registry.peers["peer"]
    assert reviewed_capabilities(201, answer(), peer, registry, review_audiences(peer)) == {"read-pods"}


@pytest.mark.parametrize("status, body, code, reason", [
    (403, None, 503, "TokenReviewUnavailable"),                     # the gateway may not review: its RBAC
    (201, answer(authenticated=False), 401, "TokenInvalid"),
    (201, answer(audiences=()), 401, "TokenAudienceMismatch"),       # not audience-aware: no grant, not every one
    (201, answer(audiences=["kubernetes"]), 401, "TokenAudienceMismatch"),
    (201, answer(username="system:serviceaccount:mod:other"), 403, "NotAConsumer"),
    (201, answer(username="alice"), 403, "NotAConsumer"),
])
def test_review_answers_that_grant_nothing_say_why(registry, status, body, code, reason):
    peer = registry.peers["peer"]
    with pytest.raises(Refusal) as err:
        reviewed_capabilities(status, body, peer, registry, review_audiences(peer))
    assert (err.value.code, err.value.reason) == (code, reason)
