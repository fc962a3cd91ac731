"""Deckhouse-shaped values for the chart tests: `values(settings, **global)` is what Deckhouse passes the module
(lab/deckhouse_module.py), and `objects(values)` what the module renders from them."""

from __future__ import annotations

import copy

import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError

from lab import deckhouse_module

UUID = "0b7c3e1a-5f2d-4c8e-9a61-2d4f8b3e7c10"
CERT_MANAGER = {"mode": "CertManager", "certManager": {"clusterIssuerName": "company-ca"}}
CUSTOM_CERTIFICATE = {"mode": "CustomCertificate", "customCertificate": {"secretName": "example-com-tls"}}
CERT_DATA = {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}
# The monitoring modules as Deckhouse enables them: the CRDs' modules beside the operator's and Prometheus's.
OPTIONAL = ("operator-prometheus", "operator-prometheus-crd", "prometheus", "prometheus-crd", "vertical-pod-autoscaler")
BASE_MODULES = ("user-authn", "cert-manager")
KUBE_VERSIONS = ("1.30", "1.37")
# Kinds outside the Kubernetes schemas: those of Deckhouse's modules and of cert-manager.
FOREIGN = {"cert-manager.io/v1/Certificate", "deckhouse.io/v1/DexClient", "monitoring.coreos.com/v1/PodMonitor",
           "monitoring.coreos.com/v1/PrometheusRule", "deckhouse.io/v1/GrafanaDashboardDefinition",
           "autoscaling.k8s.io/v1/VerticalPodAutoscaler",
           "observability.deckhouse.io/v1alpha1/ClusterObservabilityMetricsRulesGroup",
           "observability.deckhouse.io/v1alpha1/ClusterObservabilityDashboard"}


def values(settings: dict | None = None, *, internal: dict | None = None, **global_kw) -> dict:
    global_kw.setdefault("public_domain_template", "%s.example.com")
    global_kw.setdefault("cluster_uuid", UUID)
    global_kw.setdefault("https", CERT_MANAGER)
    global_kw.setdefault("enabled_modules", BASE_MODULES)
    https = global_kw["https"]
    module_https = (settings or {}).get("https") or {}
    if internal is None and "CustomCertificate" in (https.get("mode"), module_https.get("mode")):
        internal = {"customCertificateData": dict(CERT_DATA)}
    return deckhouse_module.module_values(copy.deepcopy(settings or {}), internal=internal, **global_kw)


def discovered_ha(vals: dict, control_plane_nodes: int) -> dict:
    """`vals` of a cluster whose high availability nobody set: Deckhouse then has no global.highAvailability and
    derives it from the control plane (three or more nodes)."""
    vals = copy.deepcopy(vals)
    vals["global"].pop("highAvailability", None)
    vals["global"]["discovery"]["clusterControlPlaneIsHighlyAvailable"] = control_plane_nodes >= 3
    return vals


def external(vals: dict, base: str = "registry.example.com/deckhouse-modules", dockercfg: str = "eyJhdXRocyI6e319"
             ) -> dict:
    """`vals` of the module installed from a ModuleSource: Deckhouse sets peering.registry from the source."""
    vals = copy.deepcopy(vals)
    vals["peering"]["registry"] = {"base": base, "dockercfg": dockercfg}
    return vals


def objects(chart, vals: dict) -> list[dict]:
    return deckhouse_module.render(vals, chart=chart)


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def kinds(objs: list[dict]) -> list[str]:
    return sorted(o["kind"] for o in objs)


def validate_all(objs: list[dict], version: str) -> set[str]:
    """Validate every object strictly (unknown fields are errors); return the kinds the schemas do not know."""
    skipped: set[str] = set()
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except SchemaNotFoundError:
            skipped.add(f"{obj['apiVersion']}/{obj['kind']}")
    return skipped
