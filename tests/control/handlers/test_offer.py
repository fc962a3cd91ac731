"""The offer a peer pulls is the one in the API, not an informer's possibly older copy.

The reconciler notifies the peer right after it writes a new offer; the peer's pull can arrive before this
process's watch has delivered that write. An answer from a cache would then be the old offer, with no later notify
to correct it.
"""

from __future__ import annotations

import types

import pytest

from control.handlers.peer import PeerHandlers
from control.kube import ApiError
from gateway.protocol import PeerCall
from contract.errors import Refusal
from gateway.registry import Peer

PEER = Peer(name="to-b", uuid="22222222-2222-2222-2222-222222222222", fingerprints=frozenset(), issuer_url=None,
            jwks_json=None, effective=frozenset(), connector_id="peering-to-b", entrance=None, peer_ca_pem=None,
            client_cert_pem=None, client_key_pem=None)


class Kube:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.reads: list[str] = []

    async def get_or_none(self, resource, name, namespace=None):
        self.reads.append(name)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def handlers(kube: Kube) -> PeerHandlers:
    ctx = types.SimpleNamespace(kube=kube, namespace="d8-peering", handlers=None)
    return PeerHandlers(ctx, pull_now=lambda name: None)


async def test_the_offer_is_read_from_the_api_at_each_pull() -> None:
    offer = {"projects": [{"name": "shop", "namespaces": ["shop", "shop-eu"]}], "capabilities": [],
             "peeringVersion": "0.1.0"}
    kube = Kube({"metadata": {"name": "to-b"}, "status": {"offer": offer}})
    answer = await handlers(kube).offer(PeerCall(peer=PEER, op="offer", body=None))
    assert kube.reads == ["to-b"]
    assert answer == {"alias": "to-b", "offer": offer}


@pytest.mark.parametrize("answer, message", [
    ({"metadata": {"name": "to-b"}}, "not computed yet"),
    (None, "not computed yet"),
    (ApiError(500, "InternalError", "etcd is away"), "cannot read its offer right now (InternalError)"),
])
async def test_no_offer_or_no_api_is_a_retryable_503(answer, message) -> None:
    with pytest.raises(Refusal) as refused:
        await handlers(Kube(answer)).offer(PeerCall(peer=PEER, op="offer", body=None))
    assert refused.value.code == 503 and message in refused.value.message
