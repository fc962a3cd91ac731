"""Where a lab cluster's parts are and what it is made of: the repository's paths, the names and bounds every
cluster shares, the CRDs it installs, and the files it writes (`ClusterFiles`, lab.json's entry)."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib

import yaml

from lab import certs
from lab.certs import kubeconfig
from lab.userauthn_module import MODULE_DEX_CLIENT_ID, MODULE_DEX_CLIENT_SECRET_NAME
from lab.real.process import write


ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE_CRDS = ROOT / "charts" / "peering" / "crds"
CHART = ROOT / "charts" / "peering"
LAB_CRDS = pathlib.Path(__file__).resolve().parent / "apiserver" / "crds"
NAMESPACE = "d8-peering"
# The CRDs of Deckhouse's module manager (lab/module_manager.py), which no lab cluster starts without.
MODULE_MANAGER_CRDS = ("moduleconfigs.deckhouse.io", "modules.deckhouse.io")
EGRESS_HOST = "peering-gateway.d8-peering.svc"
# The module's Dex client, as user-authn makes it from the chart's DexClient `peering` (lab/userauthn_module.py).
DEX_CLIENT_ID = MODULE_DEX_CLIENT_ID
DEX_CLIENT_SECRET_NAME = MODULE_DEX_CLIENT_SECRET_NAME
# Every default Deckhouse cluster's ServiceAccount issuer, so every lab cluster's (each with its own key).
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The modules a lab cluster has enabled besides those its module manager keeps (user-authn and peering), as
# global.enabledModules says: cert-manager (the https mode) and multitenancy-manager (Projects). No monitoring or VPA
# modules, so none of their objects are rendered.
OTHER_MODULES = ("cert-manager", "multitenancy-manager")
READY_TIMEOUT = 90.0
# What answers as a lab cluster's API server: the emulator (lab/apiserver/, in this process, the fast default) or a
# real etcd + kube-apiserver + kube-controller-manager (lab/real/, processes; `cluster.api` is then lab/real/api.py).
APISERVERS = ("emulator", "real")

# The chart runs 2; a lab cluster may run a few more to test spreading, not a fleet.
MAX_REPLICAS = 8


def known_crds() -> list[str]:
    """The CRDs a lab cluster installs at start: the lab's (Project, TokenExchangeProvider, ModuleConfig, Module) and
    the module's."""
    return list(crd_documents())


def check_crd_names(names) -> list[str]:
    """The names as a list, each one a CRD the lab installs; ValueError naming the unknown ones otherwise."""
    names = list(names)
    known = known_crds()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown CRD {', '.join(unknown)}: name a CRD the lab installs, one of {', '.join(known)}")
    kept = [n for n in names if n in MODULE_MANAGER_CRDS]
    if kept:
        raise ValueError(f"CRD {', '.join(kept)} is Deckhouse's own, which its module manager needs (every Deckhouse "
                         "cluster has it): leave out another")
    return names


def crd_documents() -> dict[str, dict]:
    """Every CRD a lab cluster knows, by name: the lab's (lab/apiserver/crds/), then the module's."""
    docs: dict[str, dict] = {}
    for path in sorted(LAB_CRDS.glob("*.yaml")) + sorted(MODULE_CRDS.glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                docs[doc["metadata"]["name"]] = doc
    return docs


def check_apiserver(apiserver: str) -> str:
    if apiserver not in APISERVERS:
        raise ValueError(f"apiserver {apiserver!r}: choose one of {', '.join(APISERVERS)} (emulator is the in-process "
                         "default; real runs etcd and kube-apiserver, built by `python -m lab.real build`)")
    return apiserver



async def gather_all(coros) -> None:
    """Run concurrently; on the first failure cancel the others, wait for them, and raise that failure."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()




class ClusterFiles:
    """The files of a `LabCluster` (lab/cluster.py) under `DIR/<c>/`, and its entry in lab.json."""


    def _write_trust(self) -> None:
        write(self.path("ca-bundle.crt"), b"".join(self.trusted_ca_pems), 0o644)

    def _write_files(self) -> None:
        write(self.path("public-ca.crt"), self.pki.public_ca.cert_pem, 0o644)
        write(self.path("client-ca.crt"), self.pki.client_ca.cert_pem, 0o644)
        server = f"https://127.0.0.1:{self.api.port}"
        tls_name = certs.api_host(self.name)
        admin = kubeconfig(self.name, server, self.pki.public_ca.cert_pem, tls_name, {
            "client-certificate-data": base64.b64encode(self.pki.admin.cert_pem).decode(),
            "client-key-data": base64.b64encode(self.pki.admin.key_pem).decode(),
        })
        # JSON, which every YAML reader reads the same: Go's YAML 1.1 takes an unquoted cluster name `y`, `n`, `on`
        # or `off` for a boolean, and PyYAML does not quote them.
        write(self.path("kubeconfig"), json.dumps(admin, indent=2))
        if self._peering_token is not None:
            peering = kubeconfig(self.name, self.front.url if self.front is not None else server,
                                 self.pki.public_ca.cert_pem, tls_name, {"token": self._peering_token})
            write(self.path("peering-kubeconfig"), json.dumps(peering, indent=2))

    def info(self) -> dict:
        """This cluster's entry in lab.json."""
        return {
            "name": self.name,
            "uuid": self.uuid,
            "apiserver": self.apiserver,
            "publicDomainTemplate": self.public_domain_template,
            "apiServer": f"https://127.0.0.1:{self.api.port}",
            "dexIssuer": self.dex_issuer,
            "dexClientID": DEX_CLIENT_ID,
            "serviceAccountIssuer": SERVICE_ACCOUNT_ISSUER,
            "withoutCRDs": list(self.without_crds),
            "resolve": self.resolve_map(),
            "caBundles": {
                "public": self.pki.public_ca.cert_pem.decode(),
                "client": self.pki.client_ca.cert_pem.decode(),
            },
            "files": {
                "kubeconfig": str(self.path("kubeconfig")),
                "peeringKubeconfig": str(self.path("peering-kubeconfig")),
                "publicCA": str(self.path("public-ca.crt")),
                "clientCA": str(self.path("client-ca.crt")),
                "caBundle": str(self.path("ca-bundle.crt")),
                "peeringLog": str(self.path("peering.log")),
            },
            "controlPlane": self.control_plane.info() if self.control_plane is not None else None,
            "peering": {
                "state": self.peering_state,
                "pid": self.process.pid if self.process else None,
                "ports": self.ports,
                "replicas": [r.info() for r in self.replicas],
            },
        }


