"""The lab's PKI: per cluster, the CAs and certificates a real cluster would get from elsewhere.

A real cluster's Ingress, Dex and kube-apiserver present certificates from a publicly trusted CA (cert-manager
with Let's Encrypt, or a custom certificate); the lab stands in a per-cluster "public" CA for that. The API
server's admin client certificate comes from a separate client CA, as kubeadm's does. Keys are ECDSA P-256.
The peering CA is not here: the peering process creates its own, as in production.
"""

from __future__ import annotations

import base64

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any demo or benchmark run; the lab never rotates these.
_VALIDITY = datetime.timedelta(days=30)
# Issued certificates start slightly in the past so that clock differences between processes never matter.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class CertKey:
    """A certificate with its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _builder(subject: x509.Name, issuer: x509.Name, public_key, now, *, ca: bool) -> x509.CertificateBuilder:
    """What every lab certificate shares: names, key, validity window, CA flag and the key usage that goes with it."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    )


class CA:
    """A self-signed certificate authority that issues server and client certificates."""

    def __init__(self, common_name: str) -> None:
        self._key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        public_key = self._key.public_key()
        self._cert = (
            _builder(name, name, public_key, now, ca=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.key_pem = _key_pem(self._key)

    def _issue(self, subject: x509.Name, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier) -> CertKey:
        key = _new_key()
        now = _now()
        builder = (
            _builder(subject, self._cert.subject, key.public_key(), now, ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return CertKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_server(self, hosts: list[str], ips: list[str] = ()) -> CertKey:
        """A serving certificate for the DNS names `hosts` and the IP addresses `ips`."""
        if not hosts and not ips:
            raise ValueError("a server certificate needs at least one host name or IP address")
        sans: list[x509.GeneralName] = [x509.DNSName(h) for h in hosts]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else ips[0])])
        return self._issue(subject, sans, ExtendedKeyUsageOID.SERVER_AUTH)

    def issue_client(self, common_name: str, organizations: list[str] = ()) -> CertKey:
        """A client certificate as kube-apiserver reads it: CN is the user, each O a group."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        return self._issue(x509.Name(attrs), [], ExtendedKeyUsageOID.CLIENT_AUTH)


def server_ssl_context(cert: CertKey, client_ca_pem: bytes | None = None, *, require_client_cert: bool = False) -> ssl.SSLContext:
    """A server-side TLS context presenting `cert`; with `client_ca_pem`, client certs are asked for and verified."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_cert_chain(ctx, cert)
    if client_ca_pem is not None:
        ctx.load_verify_locations(cadata=client_ca_pem.decode())
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_ssl_context(ca_pem: bytes, cert: CertKey | None = None) -> ssl.SSLContext:
    """A client-side TLS context trusting only `ca_pem`, optionally presenting a client certificate."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    if cert is not None:
        _load_cert_chain(ctx, cert)
    return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert: CertKey) -> None:
    # ssl only loads keys from files; the temporary files live just for the call.
    with tempfile.NamedTemporaryFile(suffix=".pem") as cf, tempfile.NamedTemporaryFile(suffix=".pem") as kf:
        cf.write(cert.cert_pem)
        cf.flush()
        kf.write(cert.key_pem)
        kf.flush()
        ctx.load_cert_chain(cf.name, kf.name)


@dataclass(frozen=True)
class ClusterPKI:
    """Everything one lab cluster needs that a real cluster gets from its installer and cert-manager."""

    public_ca: CA      # stands for the publicly trusted CA behind the Ingress, Dex and the API server
    client_ca: CA      # signs API server client certificates
    api: CertKey       # api.<c>.lab and 127.0.0.1
    dex: CertKey       # dex.<c>.lab
    ingress: CertKey   # peering.<c>.lab
    admin: CertKey     # CN=admin, O=system:masters


def api_host(cluster: str) -> str:
    return f"api.{cluster}.lab"


def dex_host(cluster: str) -> str:
    return f"dex.{cluster}.lab"


def join_host(cluster: str) -> str:
    return f"peering.{cluster}.lab"


def entrance_host(cluster: str) -> str:
    return f"peering-gateway.{cluster}.lab"


def cluster_pki(cluster: str) -> ClusterPKI:
    """A fresh PKI for cluster `cluster` (its host names are `<service>.<cluster>.lab`)."""
    public_ca = CA(f"lab public CA ({cluster})")
    client_ca = CA(f"lab client CA ({cluster})")
    return ClusterPKI(
        public_ca=public_ca,
        client_ca=client_ca,
        api=public_ca.issue_server([api_host(cluster)], ["127.0.0.1"]),
        dex=public_ca.issue_server([dex_host(cluster)]),
        ingress=public_ca.issue_server([join_host(cluster)]),
        admin=client_ca.issue_client("admin", ["system:masters"]),
    )


def check_cluster_name(name: str) -> None:
    """A cluster name becomes a DNS label of its host names (`api.<name>.lab`)."""
    label = name.replace("-", "")
    if not name or len(name) > 63 or not label.isascii() or not label.isalnum() or name != name.lower() \
            or name.startswith("-") or name.endswith("-"):
        raise ValueError(f"cluster name {name!r}: use lower-case letters, digits and inner dashes, at most 63 "
                         "characters (it becomes a DNS label)")


def kubeconfig(cluster: str, server: str, ca_pem: bytes, tls_server_name: str, user: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode(),
            "tls-server-name": tls_server_name,
        }}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "user"}}],
        "current-context": cluster,
    }
