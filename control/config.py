"""The process's settings: one object, built once from flags and environment by `control.cli`, passed down.

Each field says what it is for; the defaults are what production wants, so that the chart only sets what differs
per cluster (the public domain template) and the lab only what differs on loopback (ports, host names).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket

from contract.names import DEX_CLIENT_NAME, NAMESPACE, dex_client_id, dex_client_secret_name


@dataclasses.dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str | None = None
    """Path of a kubeconfig; None means the in-cluster ServiceAccount (or $KUBECONFIG when set)."""

    namespace: str = NAMESPACE
    """The module's namespace: its Secrets, its Lease, its DexClient and the Secret user-authn writes for it."""

    watch_timeout: int = 300
    """Seconds after which the API server ends a watch; the informer then resumes from the last resourceVersion."""


@dataclasses.dataclass(frozen=True)
class ListenSettings:
    bind_host: str = "0.0.0.0"
    """Address every listener binds to; the lab uses 127.0.0.1."""

    entrance_port: int = 8443
    """mTLS entrance for peers (peering-gateway.<domain>); 0 lets the OS choose."""

    join_port: int = 8080
    """Join endpoint behind the Ingress (peering.<domain>); 0 lets the OS choose."""

    egress_port: int = 9443
    """In-cluster egress for local consumers (peering-gateway.d8-peering.svc); 0 lets the OS choose."""

    ops_port: int = 8081
    """Plain-HTTP /healthz, /readyz and /metrics; 0 lets the OS choose."""

    ports_file: str | None = None
    """After binding, write {"entrance", "join", "egress", "ops"} ports here as JSON (the lab reads it)."""


@dataclasses.dataclass(frozen=True)
class DexSettings:
    url: str | None = None
    """Base URL of this cluster's Dex (issuer), for token exchange; None until user-authn is known."""

    ca_file: str | None = None
    """CA bundle that signs Dex's serving certificate; None means the system trust store."""

    client_name: str = DEX_CLIENT_NAME
    """Name of the module's DexClient (deckhouse.io/v1) in the module namespace. user-authn derives the rest:
    the client ID `dex-client-<name>@<namespace>` and the Secret `dex-client-<name>` with key `clientSecret`."""

    def client_id(self, namespace: str) -> str:
        return dex_client_id(self.client_name, namespace)

    @property
    def secret_name(self) -> str:
        return dex_client_secret_name(self.client_name)


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    name: str = "peering"
    """Name of the coordination.k8s.io/v1 Lease in the module namespace."""

    identity: str = dataclasses.field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """holderIdentity of this replica; unique per process."""

    duration: float = 15.0
    """leaseDurationSeconds: how long other replicas wait after the last renewal before taking over."""

    renew_deadline: float = 10.0
    """A leader that could not renew for this long stops reconciling (it must be shorter than `duration`)."""

    retry_period: float = 2.0
    """How often candidates try to acquire and the leader renews."""


@dataclasses.dataclass(frozen=True)
class ControlSettings:
    reconcile_workers: int = 2
    """Concurrent keys per reconciler."""

    feed_coalesce: float = 0.05
    """Seconds the feed waits after a change to gather more before building one registry snapshot."""

    served_wait: float = 2.0
    """Seconds a join answer waits for this replica's registry to admit the certificate it carries (it is sent
    then, or after this bound: other replicas, and this one if it is late, catch up at the entrance)."""

    peer_sync_interval: float = 30.0
    """Seconds between pulls of each peer's offer (jittered by ±20%); a notify from the peer pulls at once."""

    selfcheck_interval: float = 60.0
    """Seconds between probes of our own entrance for ClientCertEnforced and ServerCertOurs."""

    issuer_refresh_interval: float = 60.0
    """Seconds for which the issuer and JWKS of our ServiceAccount tokens, read for our offer, are reused."""

    optional_api_interval: float = 15.0
    """Seconds between discovery checks of the APIs of other modules (Project, TokenExchangeProvider): one that
    appears is used within this time, without a restart."""

    server_cert_lifetime: float = 12 * 3600.0
    """Seconds the entrance and egress certificates are valid; renewed once half of it passed."""

    client_cert_lifetime: float = 24 * 3600.0
    """Seconds a client certificate this cluster issues to a peer is valid; the peer renews it over the peering
    once half of it passed, or, when it expired while the peer was away, once the peer is back."""


    @property
    def server_lifetime(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.server_cert_lifetime)

    @property
    def client_lifetime(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.client_cert_lifetime)


@dataclasses.dataclass(frozen=True)
class Settings:
    public_domain_template: str
    """Deckhouse's global.modules.publicDomainTemplate, e.g. "%s.example.com"."""

    kube: KubeSettings = dataclasses.field(default_factory=KubeSettings)
    listen: ListenSettings = dataclasses.field(default_factory=ListenSettings)
    dex: DexSettings = dataclasses.field(default_factory=DexSettings)
    lease: LeaseSettings = dataclasses.field(default_factory=LeaseSettings)
    control: ControlSettings = dataclasses.field(default_factory=ControlSettings)

    resolve: dict[str, str] = dataclasses.field(default_factory=dict)
    """Host name overrides {host: "ip:port"} for every outgoing client (the lab's names on loopback)."""

    workers: int = 1
    """Gateway worker processes sharing the listeners (1 = the main process only)."""

    exchanges_per_peer: float = 20.0
    """Dex token exchanges one peer's consumers may cause per second (gateway Limits.exchanges_per_peer_per_second);
    beyond it and the burst a new token gets 429 TokenExchangeRateLimited. 0 turns the bound off."""

    exchange_burst_per_peer: float = 200.0
    """Exchanges one peer may cause at once before `exchanges_per_peer` applies."""

    trusted_proxies: tuple[str, ...] = ()
    """Addresses or CIDRs of the Ingress controller in front of the join listener, whose X-Forwarded-For names the
    client the failed-join limit counts (gateway GatewayConfig.trusted_proxies); none: the socket's address."""

    log_level: str = "INFO"
    """Level of the JSON log lines."""

    def __post_init__(self) -> None:
        check_domain_template(self.public_domain_template)

    def domain(self, name: str) -> str:
        """The public host of `name` (peering, peering-gateway) under the domain template."""
        return self.public_domain_template % name

    @property
    def entrance_host(self) -> str:
        return self.domain("peering-gateway")

    @property
    def join_host(self) -> str:
        return self.domain("peering")


def check_domain_template(template: str) -> None:
    """Refuse a template the module cannot build host names from, saying what is expected."""
    if not isinstance(template, str) or template.count("%s") != 1 or "%" in template.replace("%s", ""):
        raise ValueError(f"public domain template {template!r} must contain %s exactly once and no other %, "
                         f"for example %s.example.com")
    host = template % "peering-gateway"
    if not host or any(c.isspace() or c in "/:@" for c in host) or host.startswith(".") or ".." in host:
        raise ValueError(f"public domain template {template!r} does not make a host name: "
                         f"{host!r}; expected something like %s.example.com")
