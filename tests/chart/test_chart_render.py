"""The chart renders with the Helm v4 SDK in every supported mode, every object it renders is valid against the
Kubernetes schemas, lint is clean, and the objects say what the module needs: the process's arguments, ports,
probes and hardening, the four Services, the join Ingress with TLS by https.mode, and RBAC without wildcards."""

from __future__ import annotations

import copy
import itertools

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from chart_paths import CHART_DIR

KUBE_VERSIONS = ("1.30", "1.37")
NAMESPACE = "d8-peering"
GLOBAL = {"global": {"modules": {"publicDomainTemplate": "%s.example.com"}}}
CERT_MANAGER = {
    "global": {"modules": {"publicDomainTemplate": "%s.example.com",
                           "https": {"mode": "CertManager", "certManager": {"clusterIssuerName": "company-ca"}}}}
}
CUSTOM_CERTIFICATE = {
    "global": {"modules": {"publicDomainTemplate": "%s.example.com",
                           "https": {"mode": "CustomCertificate",
                                     "customCertificate": {"secretName": "example-com-tls"}}}}
}
MODES = {"CertManager": CERT_MANAGER, "CustomCertificate": CUSTOM_CERTIFICATE}
ENTRANCE_MODES = ("LoadBalancer", "IngressNginxPassthrough")


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def merged(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        _merge(out, copy.deepcopy(layer))
    return out


def _merge(into: dict, layer: dict) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def render(chart, values: dict) -> list[dict]:
    manifests = chart.render(values, name="peering", namespace=NAMESPACE, is_install=True)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def validate_all(objects: list[dict], version: str) -> set[str]:
    """Validate every object strictly (unknown fields are errors); return the kinds the schemas do not know."""
    skipped: set[str] = set()
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except SchemaNotFoundError:
            skipped.add(f"{obj['apiVersion']}/{obj['kind']}")
    return skipped


@pytest.mark.parametrize(("https_mode", "entrance_mode"), list(itertools.product(MODES, ENTRANCE_MODES)))
def test_every_rendered_object_is_valid_kubernetes(chart, https_mode: str, entrance_mode: str) -> None:
    objects = render(chart, merged(MODES[https_mode], {"entrance": {"mode": entrance_mode}}))
    for version in KUBE_VERSIONS:
        skipped = validate_all(objects, version)
        # cert-manager's Certificate is the only kind outside the Kubernetes schemas.
        assert skipped == ({"cert-manager.io/v1/Certificate"} if https_mode == "CertManager" else set())
    kinds = sorted(o["kind"] for o in objects)
    expected = sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "Role", "RoleBinding",
         "RoleBinding", "ClusterRole", "ClusterRole", "ClusterRole", "Deployment", "Service", "Service", "Service",
         "Service", "Ingress", "PodDisruptionBudget"]
        + (["Certificate"] if https_mode == "CertManager" else [])
        + (["Ingress"] if entrance_mode == "IngressNginxPassthrough" else [])
    )
    assert kinds == expected


def test_a_broken_object_fails_validation() -> None:
    """The validation above must be able to fail: a misspelled field of a Deployment is refused."""
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replica": 2, "selector": {}, "template": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_crds_are_valid_custom_resource_definitions(chart) -> None:
    """The CRDs validate against apiextensions.k8s.io/v1. Upstream's schema does not know Deckhouse's
    x-kubernetes-sensitive-data, so the strict pass runs without exactly the two markers the reference asks for."""
    crds = [yaml.safe_load(c["data"]) for c in chart.crds]
    assert sorted(c["spec"]["names"]["kind"] for c in crds) == ["ClusterPeer", "PeeringCapability", "ProjectPeer"]
    removed: list[str] = []

    def strip(node, path):
        if isinstance(node, dict):
            if node.pop("x-kubernetes-sensitive-data", None) is not None:
                removed.append(path)
            for key, value in node.items():
                strip(value, f"{path}.{key}")
        elif isinstance(node, list):
            for item in node:
                strip(item, path)

    for crd in crds:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crd, version, strict=False)
        upstream = copy.deepcopy(crd)
        strip(upstream, crd["spec"]["names"]["kind"])
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(upstream, version, strict=True)
    assert sorted(p.replace(".properties.", ".").split("openAPIV3Schema.")[1] for p in removed) == [
        "spec.join.connectionString",
        "status.invite.connectionString",
    ]


def test_the_sdk_is_helm_4() -> None:
    """The module is deployed by Helm 4; rendering with another major version would prove something else."""
    assert helm.helm_sdk_version().startswith("v4.")


@pytest.mark.parametrize(("https_mode", "entrance_mode"), list(itertools.product(MODES, ENTRANCE_MODES)))
def test_lint_is_clean(https_mode: str, entrance_mode: str) -> None:
    values = merged(MODES[https_mode], {"entrance": {"mode": entrance_mode}})
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == [] and report["messages"] == []


def test_lint_reports_a_bad_value() -> None:
    """Lint must be able to complain, or a clean report means nothing. (Helm's lint renders with `fail` made
    lenient, so the template checks are proven by rendering below; the schema is what lint enforces.)"""
    report = helm.lint(CHART_DIR, merged(GLOBAL, {"replicas": 0}), strict=True, namespace=NAMESPACE)
    assert any("/replicas" in m["error"] for m in report["messages"] if m["severity"] == 3)


def test_cert_manager_mode_issues_the_join_certificate_from_the_cluster_issuer(chart) -> None:
    objects = render(chart, CERT_MANAGER)
    cert = one(objects, "Certificate", "peering-join")
    ingress = one(objects, "Ingress", "peering-join")
    assert cert["metadata"]["namespace"] == NAMESPACE
    assert cert["spec"]["dnsNames"] == ["peering.example.com"]
    assert cert["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "company-ca"}
    assert ingress["spec"]["tls"] == [{"hosts": ["peering.example.com"], "secretName": cert["spec"]["secretName"]}]


def test_custom_certificate_mode_serves_the_named_secret(chart) -> None:
    objects = render(chart, CUSTOM_CERTIFICATE)
    assert not [o for o in objects if o["kind"] == "Certificate"]
    ingress = one(objects, "Ingress", "peering-join")
    assert ingress["spec"]["tls"] == [{"hosts": ["peering.example.com"], "secretName": "example-com-tls"}]


def test_deckhouse_defaults_apply_when_only_the_domain_template_is_given(chart) -> None:
    """Deckhouse's own defaults: CertManager with the letsencrypt ClusterIssuer, ingress class nginx."""
    objects = render(chart, GLOBAL)
    assert one(objects, "Certificate", "peering-join")["spec"]["issuerRef"]["name"] == "letsencrypt"
    assert one(objects, "Ingress", "peering-join")["spec"]["ingressClassName"] == "nginx"


def test_top_level_values_override_the_global_ones(chart) -> None:
    objects = render(chart, merged(CERT_MANAGER, {
        "publicDomainTemplate": "%s.peers.example.org",
        "https": {"mode": "CustomCertificate", "customCertificate": {"secretName": "own-tls"}},
        "ingressClass": "public",
    }))
    ingress = one(objects, "Ingress", "peering-join")
    assert ingress["spec"]["rules"][0]["host"] == "peering.peers.example.org"
    assert ingress["spec"]["tls"][0]["secretName"] == "own-tls"
    assert ingress["spec"]["ingressClassName"] == "public"
    assert not [o for o in objects if o["kind"] == "Certificate"]
    args = one(objects, "Deployment", "peering")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--public-domain-template") + 1] == "%s.peers.example.org"


def test_dex_url_can_be_given(chart) -> None:
    objects = render(chart, merged(GLOBAL, {"dex": {"url": "https://dex.d8-user-authn.svc"}}))
    [container] = one(objects, "Deployment", "peering")["spec"]["template"]["spec"]["containers"]
    assert {"name": "PEERING_DEX_URL", "value": "https://dex.d8-user-authn.svc"} in container["env"]


def test_global_ingress_class_is_used(chart) -> None:
    objects = render(chart, merged(GLOBAL, {"global": {"modules": {"ingressClass": "internet"}}}))
    assert one(objects, "Ingress", "peering-join")["spec"]["ingressClassName"] == "internet"


def test_the_join_ingress_routes_only_the_join_endpoint_to_the_join_listener(chart) -> None:
    objects = render(chart, GLOBAL)
    [rule] = one(objects, "Ingress", "peering-join")["spec"]["rules"]
    assert rule["host"] == "peering.example.com"
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/v1/join", "Exact")
    service = one(objects, "Service", path["backend"]["service"]["name"])
    [port] = [p for p in service["spec"]["ports"] if p["name"] == path["backend"]["service"]["port"]["name"]]
    assert container_port(objects, port["targetPort"]) == 8080


def container_port(objects: list[dict], name: str) -> int:
    [container] = one(objects, "Deployment", "peering")["spec"]["template"]["spec"]["containers"]
    [port] = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


@pytest.mark.parametrize("entrance_mode", ENTRANCE_MODES)
def test_four_services_reach_the_four_listeners(chart, entrance_mode: str) -> None:
    objects = render(chart, merged(GLOBAL, {"entrance": {"mode": entrance_mode}}))
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    pod_labels = one(objects, "Deployment", "peering")["spec"]["template"]["metadata"]["labels"]
    reached = {}
    for name, service in services.items():
        assert service["metadata"]["namespace"] == NAMESPACE
        assert service["spec"]["selector"].items() <= pod_labels.items(), name
        [port] = service["spec"]["ports"]
        reached[name] = (service["spec"]["type"], port["port"], container_port(objects, port["targetPort"]))
    entrance_type = "LoadBalancer" if entrance_mode == "LoadBalancer" else "ClusterIP"
    assert reached == {
        "peering-entrance": (entrance_type, 443, 8443),
        # The egress is reached as peering-gateway.d8-peering.svc (docs/internals.md).
        "peering-gateway": ("ClusterIP", 443, 9443),
        "peering-join": ("ClusterIP", 80, 8080),
        "peering-ops": ("ClusterIP", 8081, 8081),
    }


def test_the_passthrough_entrance_keeps_tls_intact(chart) -> None:
    objects = render(chart, merged(GLOBAL, {"entrance": {"mode": "IngressNginxPassthrough"}}))
    ingress = one(objects, "Ingress", "peering-entrance")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true"
    assert "tls" not in ingress["spec"]
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "peering-gateway.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "peering-entrance"


def test_the_load_balancer_entrance_takes_annotations_and_source_ranges(chart) -> None:
    objects = render(chart, merged(GLOBAL, {"entrance": {"loadBalancer": {
        "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        "sourceRanges": ["203.0.113.0/24"]}}}))
    service = one(objects, "Service", "peering-entrance")
    assert service["metadata"]["annotations"] == {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}
    assert service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


def test_the_deployment_runs_the_process_hardened_and_spread(chart) -> None:
    objects = render(chart, GLOBAL)
    deployment = one(objects, "Deployment", "peering")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    assert pod["serviceAccountName"] == "peering"
    assert [container["command"][0], *container["args"]] == [
        "peering", "run", "--namespace", "d8-peering", "--public-domain-template", "%s.example.com",
        "--ops-port", "8081", "--entrance-port", "8443", "--egress-port", "9443", "--join-port", "8080",
    ]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {"PEERING_IDENTITY": {"fieldRef": {"fieldPath": "metadata.name"}},
                   "PEERING_DEX_URL": "https://dex.example.com"}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"]["path"] == path
        assert container_port(objects, container[probe]["httpGet"]["port"]) == 8081
    assert set(container["resources"]) == {"requests", "limits"}
    assert set(container["resources"]["requests"]) == set(container["resources"]["limits"]) == {"cpu", "memory"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_image_replicas_and_resources_follow_the_values(chart) -> None:
    digest = "sha256:" + "ab" * 32
    objects = render(chart, merged(GLOBAL, {
        "image": {"repository": "registry.example.com/peering", "tag": "1.2.3"},
        "replicas": 3,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
    }))
    deployment = one(objects, "Deployment", "peering")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 3
    assert container["image"] == "registry.example.com/peering:1.2.3"
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    objects = render(chart, merged(GLOBAL, {"image": {"repository": "registry.example.com/peering",
                                                      "digest": digest}}))
    [container] = one(objects, "Deployment", "peering")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.example.com/peering@{digest}"


def test_the_disruption_budget_covers_the_pods(chart) -> None:
    objects = render(chart, GLOBAL)
    pdb = one(objects, "PodDisruptionBudget", "peering")
    pod_labels = one(objects, "Deployment", "peering")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_namespaced_objects_are_in_the_module_namespace(chart) -> None:
    objects = render(chart, merged(CERT_MANAGER, {"entrance": {"mode": "IngressNginxPassthrough"}}))
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    where = {(o["kind"], o["metadata"]["name"]): o["metadata"].get("namespace") for o in objects
             if o["kind"] not in cluster_scoped}
    assert {k: ns for k, ns in where.items() if ns != NAMESPACE} == {
        ("Role", "d8:peering:cluster-uuid"): "kube-system",
        ("RoleBinding", "d8:peering:cluster-uuid"): "kube-system",
    }
    assert one(objects, "Namespace", NAMESPACE)


# --- bad values -------------------------------------------------------------------------------------------------

BAD_VALUES = [
    pytest.param({}, ["publicDomainTemplate is not set", 'such as "%s.example.com"'], id="no-template"),
    pytest.param({"publicDomainTemplate": "example.com"},
                 ['publicDomainTemplate "example.com" has no %s', 'such as "%s.example.com"'], id="template-no-%s"),
    pytest.param({"global": {"modules": {"publicDomainTemplate": "peers.example.com"}}},
                 ['publicDomainTemplate "peers.example.com" has no %s', "global.modules.publicDomainTemplate"],
                 id="global-template-no-%s"),
    pytest.param({"publicDomainTemplate": "%s.%s.example.com"},
                 ['publicDomainTemplate "%s.%s.example.com" has %s 2 times', "exactly once"], id="template-two-%s"),
    pytest.param({"publicDomainTemplate": "%s.Example_com"},
                 ['makes "peering.Example_com", which is not a DNS name'], id="template-not-dns"),
    pytest.param(merged(GLOBAL, {"https": {"mode": "Disabled"}}),
                 ['https.mode "Disabled" does not work with the peering module', "CertManager or CustomCertificate"],
                 id="https-disabled"),
    pytest.param(merged(GLOBAL, {"global": {"modules": {"https": {"mode": "OnlyInURI"}}}}),
                 ['https.mode "OnlyInURI" does not work with the peering module',
                  "set https.mode (or global.modules.https.mode) to CertManager or CustomCertificate"],
                 id="global-https-only-in-uri"),
    pytest.param(merged(GLOBAL, {"https": {"mode": "Letsencrypt"}}),
                 ['https.mode "Letsencrypt" is not a known mode', "CertManager or CustomCertificate"],
                 id="https-unknown"),
    pytest.param(merged(GLOBAL, {"https": {"mode": "CustomCertificate"}}),
                 ["https.customCertificate.secretName is not set", "kubernetes.io/tls Secret in d8-peering"],
                 id="custom-certificate-without-secret"),
    pytest.param(merged(GLOBAL, {"dex": {"url": "http://dex.example.com"}}),
                 ['dex.url "http://dex.example.com" is not an https:// URL', "leave it empty for https://dex.<domain>"],
                 id="dex-url-not-https"),
    pytest.param(merged(GLOBAL, {"entrance": {"mode": "NodePort"}}),
                 ['entrance.mode "NodePort" is not a known mode', "LoadBalancer or IngressNginxPassthrough"],
                 id="entrance-unknown"),
]


@pytest.mark.parametrize(("values", "expected"), BAD_VALUES)
def test_bad_values_fail_rendering_with_what_to_set(chart, values: dict, expected: list[str]) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        render(chart, values)
    for text in expected:
        assert text in str(failure.value)


@pytest.mark.parametrize(("values", "path"), [
    ({"replicas": 0}, "/replicas"),
    ({"replicas": "two"}, "/replicas"),
    ({"image": {"repository": ""}}, "/image/repository"),
    ({"image": {"repository": "r", "digest": "latest"}}, "/image/digest"),
    ({"entrance": {"loadBalancer": {"sourceRange": []}}}, "/entrance/loadBalancer"),
])
def test_values_of_the_wrong_type_are_refused_by_the_schema(chart, values: dict, path: str) -> None:
    with pytest.raises(helm.HelmValuesError) as failure:
        render(chart, merged(GLOBAL, values))
    assert path in str(failure.value)
