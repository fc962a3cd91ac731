"""The gateway's settings: one object, built once by the process from flags and environment, passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Limits:
    """Bounds on what one client may make the gateway hold; every refusal is answered as a Kubernetes Status."""

    max_header_bytes: int = 32 * 1024
    """Longest request line or single header line, in bytes; longer gives 431. Above max_token_bytes, so that
    an oversized token gets its own reason."""
    max_headers: int = 100
    """Most header lines in one request; more gives 431."""
    max_body_bytes: int = 3 * 1024 * 1024
    """Largest request body proxied to an API server (kube-apiserver's own limit is 3 MiB); larger gives 413."""
    max_peer_call_bytes: int = 256 * 1024
    """Largest JSON body of a /peering/v1/ call."""
    max_join_bytes: int = 64 * 1024
    """Largest JSON body of a POST /v1/join."""
    max_token_bytes: int = 16 * 1024
    """Largest bearer token; a longer one is refused before it is parsed."""
    max_connections: int = 10000
    """Open TLS connections per listener and worker; beyond it new connections are closed at once."""
    max_connections_per_peer: int = 2000
    """Open entrance connections of one peer (by certificate fingerprint) per worker."""
    handshake_timeout: float = 10.0
    """Seconds a client has to complete the TLS handshake."""
    request_head_timeout: float = 10.0
    """Seconds a client has, from the first bytes of a request head, to send all of it (every listener, both
    entrance paths); later gives 408 RequestTimeout and the connection is closed. A body is bounded by size."""
    idle_timeout: float = 330.0
    """Seconds a client connection may stay silent between requests, and an upstream may take to begin its
    answer. A stream that has begun (a watch) is never cut for silence: a client waiting on a quiet resource is
    not idle; TCP keepalive finds a peer or upstream that went away."""
    upstream_reuse_idle: float = 60.0
    """Seconds a pooled upstream connection may have been idle and still carry a request: safely below
    kube-apiserver's 90 s idle timeout, so that no request is sent into the upstream's close."""
    token_skew: float = 30.0
    """Seconds of clock skew tolerated on nbf of a peer's token (issued by a cluster whose clock is ahead). None is
    tolerated on exp, on either path: Dex, which exchanges the token, allows none (tokens.check_expiry)."""
    upstream_connect_timeout: float = 10.0
    """Seconds to connect to kube-apiserver, Dex or a peer's entrance."""
    exchange_timeout: float = 10.0
    """Seconds one Dex token exchange may take before the request is answered 503."""
    exchange_refresh_margin: float = 30.0
    """An exchanged token is used until this many seconds before it expires, then exchanged again."""
    token_review_ttl: float = 60.0
    """Longest time an egress TokenReview result is reused (never past the token's own expiry)."""
    upstream_pool_size: int = 256
    """Pooled connections per upstream (kube-apiserver, each peer's entrance)."""
    join_failures_per_minute: int = 10
    """Refused join attempts one client address may make per minute before it gets 429."""
    exchanges_per_peer_per_second: float = 20.0
    """Token exchanges at Dex one peer's consumers may cause per second, over the whole process (its workers
    share one exchange cache); beyond it and the burst a new token gets 429 TokenExchangeRateLimited with a
    Retry-After. A cached token costs nothing: the bound is on distinct new tokens. 0 turns the bound off."""
    registry_catch_up: float = 2.0
    """Longest a request waits for a newer registry when only a registry behind the status explains its refusal
    (a capability that exists here, is Accepted and lists the consumer, but is not effective for the peer yet:
    the control loop wrote the status a moment ago); then the refusal is answered. 0 refuses at once."""
    exchange_burst_per_peer: float = 200.0
    """Exchanges one peer may cause at once before `exchanges_per_peer_per_second` applies (a peer's consumers
    all starting together, each with a fresh token)."""
    peer_calls_per_second: float = 5.0
    """Calls of the peer protocol (/peering/v1/*) one peer may make per second over the whole process (its
    workers' calls all reach the parent); beyond it and the burst a call gets 429 PeerCallsRateLimited with a
    Retry-After. A peer's module makes about one a `--peer-sync-interval` (an offer pull), one per notify, one
    credentials delivery and a renewal twice a client certificate's lifetime. 0 turns the bound off."""
    peer_call_burst: float = 50.0
    """Peer protocol calls one peer may make at once before `peer_calls_per_second` applies (a join's delivery,
    pulls and notifies together)."""


@dataclass
class GatewayConfig:
    """Everything the gateway needs; ports 0 let the OS choose, and the bound ports are on the Gateway."""

    public_domain_template: str = "%s.example.com"
    """global.modules.publicDomainTemplate; the entrance is peering-gateway.<domain>."""
    api_server: str = "https://kubernetes.default.svc"
    """kube-apiserver URL that entrance requests and TokenReviews go to."""
    api_ca_pem: bytes | None = None
    """CA bundle of kube-apiserver; None trusts the system store."""
    api_token: Callable[[], str] = field(default=lambda: "")
    """The process's own ServiceAccount token (for TokenReview), read anew on every use since it rotates."""
    dex_url: str = "https://dex.example.com"
    """Dex's issuer URL; the token endpoint is <dex_url>/token."""
    dex_ca_pem: bytes | None = None
    """CA bundle of Dex; None trusts the system store."""
    dex_client_id: str = ""
    """Dex client allowed to exchange tokens (Secret dex-client, key clientID)."""
    dex_client_secret: Callable[[], str] = field(default=lambda: "")
    """Its secret, read on every exchange so that a rotated Secret is picked up."""
    dex_audience: str = "kubernetes"
    """Audience of the exchanged ID token: the OIDC client id kube-apiserver accepts."""
    resolve: dict[str, str] = field(default_factory=dict)
    """Host name overrides {"host": "ip:port"} for every outgoing connection (the lab's names)."""
    limits: Limits = field(default_factory=Limits)
    """Sizes, counts and timeouts."""
    workers: int = 1
    """Processes serving the entrance and egress; 0 means one per core."""
    entrance_host: str = "127.0.0.1"
    """Address of the mTLS entrance listener."""
    entrance_port: int = 0
    join_host: str = "127.0.0.1"
    """Address of the plain-HTTP join listener (TLS is terminated by the Ingress in front of it)."""
    join_port: int = 0
    egress_host: str = "127.0.0.1"
    """Address of the in-cluster egress listener (TLS from the peering CA)."""
    egress_port: int = 0
    ops_host: str = "127.0.0.1"
    """Address of the plain-HTTP ops listener: /healthz, /readyz, /metrics."""
    ops_port: int = 0
    trusted_proxies: tuple[str, ...] = ()
    """Addresses or CIDRs of the proxies in front of the join listener (the Ingress controller's pods) whose
    X-Forwarded-For / X-Real-IP name the client; from any other address those headers are ignored and the
    connection's own address is the client's. Keys the failed-join limit."""
    access_log: bool = True
    """One JSON line per request on the gateway.access logger (never a token, a path's query or an address)."""

    @property
    def entrance_host_name(self) -> str:
        return self.public_domain_template.replace("%s", "peering-gateway")

    @property
    def token_endpoint(self) -> str:
        return self.dex_url.rstrip("/") + "/token"
