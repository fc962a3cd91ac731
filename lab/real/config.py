"""What the real control plane is told: kube-apiserver's AuthenticationConfiguration and the three command lines.

Plain functions over plain data; `runner.py` writes the files and starts the processes. Where it matters to the
module, the flags are those of a Deckhouse control plane (control-plane-manager renders kubeadm's configuration):

- authentication: the structured AuthenticationConfiguration of control-plane-manager's
  `_authentication_configuration.tpl` toward Dex (audience `kubernetes`, username from `email` with no prefix,
  groups from `groups`, the user-authn extras, no `system:` usernames or groups), client certificates from the
  cluster's client CA, ServiceAccount tokens, anonymous requests as kubeadm leaves them (on: `/readyz`, `/livez`,
  `/version` are readable by `system:public-info-viewer`, everything else is refused by RBAC);
- authorization `Node,RBAC`; the default admission plugins plus `NodeRestriction` (kubeadm) and
  `OwnerReferencesPermissionEnforcement` (Deckhouse);
- ServiceAccount issuer `https://kubernetes.default.svc.cluster.local` (every default Deckhouse cluster's, so
  every lab cluster shares it) with a key pair per cluster, `--api-audiences` the issuer, TokenRequest on;
- kube-controller-manager with only `garbage-collector-controller` and `namespace-controller`, the two controllers
  whose work the module sees (owned objects deleted after their owner, a namespace's contents deleted before it
  goes), and `clusterrole-aggregation-controller` (the bootstrap `view`, `edit`, `admin` and every aggregated
  ClusterRole get their rules from it). Each runs with its own ServiceAccount's credentials, as kubeadm sets
  `--use-service-account-credentials`.
"""

from __future__ import annotations

import dataclasses
import pathlib

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Deckhouse's default serviceSubnetCIDR.
SERVICE_CLUSTER_IP_RANGE = "10.222.0.0/16"
DEX_AUDIENCE = "kubernetes"
# The garbage collector and namespace lifecycle, whose work the module sees, and ClusterRole aggregation: without
# it the bootstrap roles `view`, `edit` and `admin` (and every role made of `aggregationRule`) grant nothing.
CONTROLLERS = ("garbage-collector-controller", "namespace-controller", "clusterrole-aggregation-controller")
ADMISSION_PLUGINS = ("NodeRestriction", "OwnerReferencesPermissionEnforcement")
# The user-authn extras of Deckhouse's template: `name` is required (a token without it fails), the others are
# taken when present.
EXTRA_MAPPINGS = (
    ("user-authn.deckhouse.io/name", "claims.name"),
    ("user-authn.deckhouse.io/preferred_username",
     "has(claims.preferred_username) ? claims.preferred_username : null"),
    ("user-authn.deckhouse.io/dex-provider",
     "has(claims.federated_claims) && has(claims.federated_claims.connector_id) ? "
     "claims.federated_claims.connector_id : null"),
)
USER_VALIDATION_RULES = (
    ("!user.username.startsWith('system:')", "username cannot used reserved system: prefix"),
    ("user.groups.all(group, !group.startsWith('system:'))", "groups cannot used reserved system: prefix"),
)


@dataclasses.dataclass(frozen=True)
class JWTIssuer:
    """The OIDC issuer kube-apiserver trusts (Dex in Deckhouse).

    `url` is exactly the `iss` of its tokens; kube-apiserver reads `<url>/.well-known/openid-configuration` (or
    `discovery_url` when given, whose document must still name `url` as its issuer) and the document's
    `jwks_uri` itself. `ca_pem` signs the issuer's serving certificate.
    """

    url: str
    ca_pem: bytes
    discovery_url: str | None = None
    audiences: tuple[str, ...] = (DEX_AUDIENCE,)

    def __post_init__(self) -> None:
        if not self.url.startswith("https://"):
            raise ValueError(f"JWT issuer {self.url!r}: kube-apiserver only accepts an https:// issuer URL")
        if self.discovery_url is not None and not self.discovery_url.startswith("https://"):
            raise ValueError(f"discovery URL {self.discovery_url!r}: kube-apiserver only accepts https://")
        if b"-----BEGIN CERTIFICATE-----" not in self.ca_pem:
            raise ValueError(f"JWT issuer {self.url}: its CA must be PEM certificates")
        if not self.audiences:
            raise ValueError(f"JWT issuer {self.url}: give at least one audience")


def authentication_configuration(issuer: JWTIssuer | None) -> dict:
    """kube-apiserver's `--authentication-config`, as control-plane-manager renders it."""
    jwt = []
    if issuer is not None:
        issuer_doc: dict = {"url": issuer.url}
        if issuer.discovery_url:
            issuer_doc["discoveryURL"] = issuer.discovery_url
        issuer_doc["certificateAuthority"] = issuer.ca_pem.decode()
        issuer_doc["audiences"] = list(issuer.audiences)
        jwt.append({
            "issuer": issuer_doc,
            "claimMappings": {
                "username": {"claim": "email", "prefix": ""},
                "groups": {"claim": "groups", "prefix": ""},
                "extra": [{"key": k, "valueExpression": e} for k, e in EXTRA_MAPPINGS],
            },
            "userValidationRules": [{"expression": e, "message": m} for e, m in USER_VALIDATION_RULES],
        })
    return {"apiVersion": "apiserver.config.k8s.io/v1beta1", "kind": "AuthenticationConfiguration", "jwt": jwt}


@dataclasses.dataclass(frozen=True)
class Files:
    """Where one cluster's control plane keeps what it is given. Everything is under `dir`."""

    dir: pathlib.Path

    def _p(self, *parts: str) -> pathlib.Path:
        return self.dir.joinpath(*parts)

    # etcd
    @property
    def etcd_data(self) -> pathlib.Path: return self._p("etcd", "data")
    @property
    def etcd_ca(self) -> pathlib.Path: return self._p("etcd", "ca.crt")
    @property
    def etcd_cert(self) -> pathlib.Path: return self._p("etcd", "server.crt")
    @property
    def etcd_key(self) -> pathlib.Path: return self._p("etcd", "server.key")
    @property
    def etcd_client_cert(self) -> pathlib.Path: return self._p("kube-apiserver", "etcd-client.crt")
    @property
    def etcd_client_key(self) -> pathlib.Path: return self._p("kube-apiserver", "etcd-client.key")
    # kube-apiserver
    @property
    def apiserver_dir(self) -> pathlib.Path: return self._p("kube-apiserver")
    @property
    def serving_cert(self) -> pathlib.Path: return self._p("kube-apiserver", "apiserver.crt")
    @property
    def serving_key(self) -> pathlib.Path: return self._p("kube-apiserver", "apiserver.key")
    @property
    def client_ca(self) -> pathlib.Path: return self._p("kube-apiserver", "client-ca.crt")
    @property
    def sa_pub(self) -> pathlib.Path: return self._p("kube-apiserver", "sa.pub")
    @property
    def sa_key(self) -> pathlib.Path: return self._p("kube-apiserver", "sa.key")
    @property
    def authn_config(self) -> pathlib.Path: return self._p("kube-apiserver", "authentication-config.yaml")
    @property
    def admin_kubeconfig(self) -> pathlib.Path: return self._p("kube-apiserver", "admin.kubeconfig")
    # kube-controller-manager
    @property
    def kcm_kubeconfig(self) -> pathlib.Path: return self._p("kube-controller-manager", "kubeconfig")
    @property
    def kcm_cert(self) -> pathlib.Path: return self._p("kube-controller-manager", "serving.crt")
    @property
    def kcm_key(self) -> pathlib.Path: return self._p("kube-controller-manager", "serving.key")
    # the CONNECT proxy
    @property
    def proxy_port(self) -> pathlib.Path: return self._p("proxy", "port")
    @property
    def proxy_routes(self) -> pathlib.Path: return self._p("proxy", "routes")
    # logs and pids
    def log(self, component: str) -> pathlib.Path: return self._p(f"{component}.log")
    @property
    def pids(self) -> pathlib.Path: return self._p("control-plane.json")


def etcd_args(name: str, files: Files, client_port: int, peer_port: int) -> list[str]:
    """One member on loopback; clients need a certificate of the etcd CA, as kubeadm's etcd."""
    client = f"https://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        f"--name={name}",
        f"--data-dir={files.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}",
        "--initial-cluster-state=new",
        f"--cert-file={files.etcd_cert}",
        f"--key-file={files.etcd_key}",
        f"--trusted-ca-file={files.etcd_ca}",
        "--client-cert-auth=true",
        # A lab's data is thrown away with the lab: fsync buys nothing and costs the shared disk dearly.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_args(files: Files, secure_port: int, etcd_port: int, *,
                   service_cluster_ip_range: str = SERVICE_CLUSTER_IP_RANGE, verbosity: int = 1) -> list[str]:
    return [
        "--bind-address=127.0.0.1",
        # It refuses a loopback address in the `kubernetes` Service's endpoints; nothing in the lab routes
        # through that Service, so its endpoints are not kept (the Service itself is still there).
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--secure-port={secure_port}",
        f"--cert-dir={files.apiserver_dir / 'certs'}",
        f"--tls-cert-file={files.serving_cert}",
        f"--tls-private-key-file={files.serving_key}",
        f"--client-ca-file={files.client_ca}",
        f"--etcd-servers=https://127.0.0.1:{etcd_port}",
        f"--etcd-cafile={files.etcd_ca}",
        f"--etcd-certfile={files.etcd_client_cert}",
        f"--etcd-keyfile={files.etcd_client_key}",
        f"--authentication-config={files.authn_config}",
        "--authorization-mode=Node,RBAC",
        f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={files.sa_pub}",
        f"--service-account-signing-key-file={files.sa_key}",
        f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={service_cluster_ip_range}",
        "--allow-privileged=true",
        "--profiling=false",
        f"--v={verbosity}",
    ]


def controller_manager_args(files: Files, secure_port: int, cluster_name: str, *, verbosity: int = 1) -> list[str]:
    kubeconfig = str(files.kcm_kubeconfig)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={secure_port}",
        f"--tls-cert-file={files.kcm_cert}",
        f"--tls-private-key-file={files.kcm_key}",
        f"--controllers={','.join(CONTROLLERS)}",
        "--use-service-account-credentials=true",
        # One instance per cluster: leader election would only delay the start.
        "--leader-elect=false",
        f"--cluster-name={cluster_name}",
        "--profiling=false",
        f"--v={verbosity}",
    ]
