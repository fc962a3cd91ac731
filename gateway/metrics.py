"""Prometheus metrics of the gateway. Labels are bounded: peer, capability, code class, outcome, never
user/path/address."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("peering_gateway_requests",
                                "Requests answered, by listener, peer, capabilities, code class and outcome "
                                "(gateway/accounting.py: answered, refused, interrupted, client_closed, withdrawn, "
                                "error)", ["listener", "peer", "capability", "code", "outcome"], registry=r)
        self.latency = Histogram("peering_gateway_request_seconds", "Time to the response headers",
                                 ["listener"], buckets=_BUCKETS, registry=r)
        self.in_flight = Gauge("peering_gateway_requests_in_flight", "Requests being served", ["listener"],
                               registry=r)
        self.handshake_failures = Counter("peering_gateway_handshake_failures",
                                          "TLS handshakes refused or failed, by listener and reason",
                                          ["listener", "reason"], registry=r)
        self.connections = Gauge("peering_gateway_connections", "Open TLS connections", ["listener"], registry=r)
        self.exchange_calls = Counter("peering_gateway_token_exchange_calls", "Token exchanges at Dex, by outcome",
                                      ["outcome"], registry=r)
        self.exchange_failures = Counter("peering_gateway_token_exchange_failures",
                                         "Token exchanges that failed, by peer and reason (TokenExchangeRefused, "
                                         "TokenExchangeMisconfigured, TokenExchangeUnavailable)",
                                         ["peer", "reason"], registry=r)
        self.exchange_hits = Counter("peering_gateway_token_exchange_cache_hits",
                                     "Requests served by an exchanged token from the cache or an exchange in flight",
                                     registry=r)
        self.dex_latency = Histogram("peering_gateway_dex_seconds", "Latency of a Dex token exchange",
                                     buckets=_BUCKETS, registry=r)
        self.upstream_errors = Counter("peering_gateway_upstream_errors",
                                       "Requests that failed toward the upstream, by listener and kind",
                                       ["listener", "kind"], registry=r)
        self.watches = Gauge("peering_gateway_open_watches", "Watch streams open, by listener and peer",
                             ["listener", "peer"], registry=r)
        self.revoked = Counter("peering_gateway_revoked_connections",
                               "Connections closed because their peer left the registry", registry=r)
