"""What differs between the two listeners the engine serves (serving.Serving): the entrance, where peers' requests
come over mTLS toward this cluster's API server, and the egress, where local consumers' requests go toward a peer's
entrance. Each is a small object the connection is made with: its name (accounting and metrics), its admission
(`admission.admit_entrance` with the client certificate's fingerprint, `admission.admit_egress`), whether it
answers the peer protocol's calls, the relay pool an admitted request goes to, what `state.streams` holds the
request with, and what a failed upstream means to its client. Everything else, every connection-level behaviour,
is the engine's, once."""

from __future__ import annotations

from contract.errors import Refusal
from gateway.admission import ClientState, Decision, NeedsReview, admit_egress, admit_entrance
from gateway.authority import Authority, request_namespace
from gateway.heads import Request
from gateway.relay import RelayPool
from gateway.state import GatewayState
from gateway.status import upstream_refusal
from gateway.upstream import UpstreamError


class Listener:
    """One listener's ways. `name` labels its accounting and metrics; `peer_calls`: requests under /peering/v1/
    are the peer protocol's calls (calls.PeerCalls), not proxied; `settles_grants`: the upstream is this cluster's
    API server, whose 403 to a grant that is new may be its authorizer behind (grantlag.py)."""

    __slots__ = ("name", "peer_calls", "settles_grants")

    def __init__(self, name: str, peer_calls: bool, settles_grants: bool = False) -> None:
        self.name = name
        self.peer_calls = peer_calls
        self.settles_grants = settles_grants

    def admit(self, state: GatewayState, client: ClientState, fingerprint: str | None, request: Request, *,
              until: float | None = None) -> object:
        """The admission's decision for `request` (Admitted, NeedsExchange, NeedsReview or AwaitRegistry), or the
        Refusal of the first rule it fails; `until` as for `admission.caught_up`'s re-admission."""
        raise NotImplementedError

    def pool(self, state: GatewayState, decision: Decision) -> RelayPool:
        """Where the request admitted by `decision` (before its exchange or review) goes; a Refusal when none can."""
        raise NotImplementedError

    def authority(self, client: ClientState, decision: Decision) -> Authority | None:
        """What admitted the request (`decision`, its exchange or review done): `state.streams` holds it with it."""
        raise NotImplementedError

    def namespace(self, target: bytes, watch: bool) -> str | None:
        """The namespace `state.streams` checks the request's grants in (authority.OpenStreams.add)."""
        return None

    def upstream_refusal(self, err: UpstreamError, client: ClientState) -> Refusal:
        """What the client is answered when the upstream fails before answering."""
        raise NotImplementedError


class Entrance(Listener):
    """A peer's requests, identified by its client certificate, to this cluster's API server (`state.relay_pool`)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("entrance", peer_calls=True, settles_grants=True)

    def admit(self, state: GatewayState, client: ClientState, fingerprint: str | None, request: Request, *,
              until: float | None = None) -> object:
        return admit_entrance(state, client, fingerprint, request.method, request.target, request.fields,
                              request.length, request.chunked, until=until)

    def pool(self, state: GatewayState, decision: Decision) -> RelayPool:
        return state.relay_pool

    def authority(self, client: ClientState, decision: Decision) -> Authority | None:
        return client.authority  # set by admit_entrance, from the verified token and the certificate

    def namespace(self, target: bytes, watch: bool) -> str | None:
        return request_namespace(target) if watch else None  # a watch outlives a project's unpairing

    def upstream_refusal(self, err: UpstreamError, client: ClientState) -> Refusal:
        return upstream_refusal(err)


class Egress(Listener):
    """A local consumer's requests to a peer's API, through the peer's entrance (`state.peer_pool`)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("egress", peer_calls=False)

    def admit(self, state: GatewayState, client: ClientState, fingerprint: str | None, request: Request, *,
              until: float | None = None) -> object:
        return admit_egress(state, client, request.method, request.target, request.fields, request.length,
                            request.chunked, until=until)

    def pool(self, state: GatewayState, decision: Decision) -> RelayPool:
        assert isinstance(decision, NeedsReview)  # admit_egress admits nothing before its TokenReview
        return state.peer_pool(decision.peer)

    def authority(self, client: ClientState, decision: Decision) -> Authority | None:
        assert isinstance(decision, NeedsReview)
        # The review answered the capabilities granted (admission.complete): the stream ends when none is any more.
        return Authority(decision.peer.name, frozenset(client.capabilities.split(",")), decision.account,
                         decision.expires)

    def upstream_refusal(self, err: UpstreamError, client: ClientState) -> Refusal:
        return upstream_refusal(err, client.peer)  # a peer's entrance refusing our certificate is named
