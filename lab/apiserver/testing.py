"""Helpers for tests that need a running emulated kube-apiserver: real TLS from a throwaway CA, an admin client
certificate (group system:masters), and a kubeconfig kubectl and kubernetes-asyncio both read.

    server, kubeconfig, cert_pem, key_pem, ca_pem = await start_test_apiserver(tmp_path)
    try:
        ...
    finally:
        await server.stop()

`issue_client_cert(server, "alice", ["team"])` gives another user's certificate from the same CA.
"""

from __future__ import annotations

import base64
import datetime
import pathlib

import trustme
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.apiserver.app import ApiServer

ADMIN_USER = "lab-admin"
ADMIN_GROUPS = ("system:masters",)


def issue_client_cert(ca_or_server, user: str, groups=(), days: int = 1) -> tuple[bytes, bytes]:
    """A client certificate (CN = user, one O per group, as kube-apiserver reads them) and its key, as PEM.

    Takes the trustme CA or a server started by start_test_apiserver (which keeps its CA as `.test_ca`).
    """
    ca: trustme.CA = getattr(ca_or_server, "test_ca", ca_or_server)
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    names.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(names))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_kubeconfig(path, server_url: str, ca_pem: bytes, cert_pem: bytes | None = None,
                     key_pem: bytes | None = None, tls_server_name: str | None = None,
                     token: str | None = None) -> pathlib.Path:
    """A one-context kubeconfig with embedded credentials; the file is private (0600)."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    cluster = {"server": server_url, "certificate-authority-data": b64(ca_pem)}
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    user: dict = {}
    if cert_pem and key_pem:
        user["client-certificate-data"] = b64(cert_pem)
        user["client-key-data"] = b64(key_pem)
    if token:
        user["token"] = token
    doc = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "lab", "cluster": cluster}],
        "users": [{"name": "lab-user", "user": user}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab-user"}}],
        "current-context": "lab",
    }
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def start_test_apiserver(tmp_path, *, crd_paths=(), name: str = "lab",
                               bookmark_interval: float = 60.0, history: int = 1000, watch_queue: int = 1000,
                               without_crds=()):
    """Start an ApiServer on 127.0.0.1 (OS-chosen port) with the module's CRDs if given.

    Returns (server, kubeconfig_path, admin_client_cert_pem, admin_key_pem, ca_pem). The serving certificate names
    127.0.0.1, localhost and api.<name>.lab; the same CA signs the client certificates.
    """
    ca = trustme.CA()
    serving = ca.issue_cert("127.0.0.1", "localhost", f"api.{name}.lab")
    server = ApiServer(
        name=name, crd_paths=[pathlib.Path(p) for p in crd_paths], without_crds=without_crds,
        serving_cert_pem=b"".join(b.bytes() for b in serving.cert_chain_pems),
        serving_key_pem=serving.private_key_pem.bytes(), client_ca_pem=ca.cert_pem.bytes(),
        bookmark_interval=bookmark_interval, history=history, watch_queue=watch_queue,
    )
    server.test_ca = ca
    await server.start()
    cert_pem, key_pem = issue_client_cert(ca, ADMIN_USER, ADMIN_GROUPS)
    ca_pem = ca.cert_pem.bytes()
    kubeconfig = write_kubeconfig(pathlib.Path(tmp_path) / "kubeconfig", server.url, ca_pem, cert_pem, key_pem)
    return server, kubeconfig, cert_pem, key_pem, ca_pem
