"""The module renders with the Helm v4 SDK from values shaped exactly as Deckhouse passes them (`global.*` and
`peering.*`, lab/deckhouse_module.py), in every https and entrance mode, with and without the optional modules;
every object it renders is valid against the Kubernetes schemas; and the objects say what the module needs: the
process's arguments, ports, probes and hardening, the Services, the join Ingress with TLS by https mode, the
entrance by its mode, the parts each optional module brings, and a clear failure for every value it cannot use."""

from __future__ import annotations

import itertools

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from chart_paths import CHART_DIR
from module_values import (BASE_MODULES, CERT_MANAGER, CUSTOM_CERTIFICATE, FOREIGN, KUBE_VERSIONS, OPTIONAL,
                           discovered_ha, external, kinds, objects, one, validate_all, values)
from lab import deckhouse_module

NAMESPACE = "d8-peering"
HTTPS = {"CertManager": CERT_MANAGER, "CustomCertificate": CUSTOM_CERTIFICATE}
ENTRANCE = {"LoadBalancer": {}, "IngressNginxPassthrough": {"entrance": {
    "mode": "IngressNginxPassthrough", "ingressNginx": {"ingressClass": "passthrough"}}}}
MODULE_SETS = {"required-only": BASE_MODULES, "with-optional": BASE_MODULES + OPTIONAL}
# Shipped with Deckhouse (its registry), or installed from a ModuleSource (the source's registry and credentials).
INSTALLS = {"embedded": lambda vals: vals, "external": external}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


CASES = list(itertools.product(HTTPS, ENTRANCE, MODULE_SETS, INSTALLS))


@pytest.mark.parametrize(("https", "entrance", "modules", "install"), CASES)
def test_every_rendered_object_is_valid_kubernetes(chart, https: str, entrance: str, modules: str,
                                                   install: str) -> None:
    vals = INSTALLS[install](values(ENTRANCE[entrance], https=HTTPS[https], enabled_modules=MODULE_SETS[modules]))
    objs = objects(chart, vals)
    for version in KUBE_VERSIONS:
        assert validate_all(objs, version) <= FOREIGN
    optional = modules == "with-optional"
    expected = sorted(
        ["Namespace", "ConfigMap", "ServiceAccount", "Deployment", "Service", "Service", "Service", "Ingress",
         "PodDisruptionBudget", "NetworkPolicy", "DexClient"]
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
        + ["ClusterRole"] * 7 + ["ClusterRoleBinding"] * 2 + ["Role"] * 2 + ["RoleBinding"] * 2
        + (["Certificate"] if https == "CertManager" else ["Secret"])
        + (["Ingress"] if entrance == "IngressNginxPassthrough" else [])
        + (["Secret"] if install == "external" else [])
        + (["PodMonitor", "PrometheusRule", "GrafanaDashboardDefinition", "VerticalPodAutoscaler"] if optional
           else [])
    )
    assert kinds(objs) == expected


def test_a_broken_object_fails_validation() -> None:
    """The validation above must be able to fail: a misspelled field of a Deployment is refused."""
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replica": 2, "selector": {}, "template": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_crds_are_valid_custom_resource_definitions() -> None:
    """The CRDs validate against apiextensions.k8s.io/v1. Upstream's schema does not know Deckhouse's
    x-kubernetes-sensitive-data, so the strict pass runs without exactly the two markers the reference asks for."""
    crds = deckhouse_module.crds()
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
        strip(crd, crd["spec"]["names"]["kind"])
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crd, version, strict=True)
    assert sorted(p.replace(".properties.", ".").split("openAPIV3Schema.")[1] for p in removed) == [
        "spec.join.connectionString",
        "status.invite.connectionString",
    ]


def test_the_sdk_is_helm_4() -> None:
    """The module is deployed by Helm 4; rendering with another major version would prove something else."""
    assert helm.helm_sdk_version().startswith("v4.")


def test_helm_never_packages_what_deckhouse_reads_itself(chart) -> None:
    """crds/, openapi/, hooks/, images/ and docs/ are Deckhouse's to read; Helm sees templates/ and monitoring/."""
    assert chart.crds == []
    ignored = [line.strip() for line in (CHART_DIR / ".helmignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert {"crds/", "docs/", "hooks/", "images/", "openapi/"} <= set(ignored)
    assert "monitoring/" not in ignored and "templates/" not in ignored


def test_cert_manager_mode_issues_the_join_certificate_from_the_cluster_issuer(chart) -> None:
    objs = objects(chart, values())
    cert = one(objs, "Certificate", "peering-join")
    ingress = one(objs, "Ingress", "peering-join")
    assert cert["metadata"]["namespace"] == NAMESPACE
    assert cert["spec"]["dnsNames"] == ["peering.example.com"]
    assert cert["spec"]["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "company-ca"}
    assert ingress["spec"]["tls"] == [{"hosts": ["peering.example.com"], "secretName": cert["spec"]["secretName"]}]
    assert cert["spec"]["secretName"] == "ingress-tls"


def test_custom_certificate_mode_serves_the_copy_of_the_d8_system_secret(chart) -> None:
    """The Secret named in the setting lives in d8-system; the hook's copy is served as <name>-customcertificate."""
    objs = objects(chart, values(https=CUSTOM_CERTIFICATE))
    assert not [o for o in objs if o["kind"] == "Certificate"]
    secret = one(objs, "Secret", "ingress-tls-customcertificate")
    assert secret["metadata"]["namespace"] == NAMESPACE and secret["type"] == "kubernetes.io/tls"
    assert secret["data"] == {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}
    ingress = one(objs, "Ingress", "peering-join")
    assert ingress["spec"]["tls"] == [{"hosts": ["peering.example.com"], "secretName": "ingress-tls-customcertificate"}]


def test_global_defaults_apply_when_the_module_config_is_empty(chart) -> None:
    """`enabled: true` alone: Deckhouse's https mode with its letsencrypt ClusterIssuer, ingress class nginx."""
    objs = objects(chart, values(https={"mode": "CertManager", "certManager": {"clusterIssuerName": "letsencrypt"}}))
    assert one(objs, "Certificate", "peering-join")["spec"]["issuerRef"]["name"] == "letsencrypt"
    assert one(objs, "Ingress", "peering-join")["spec"]["ingressClassName"] == "nginx"
    assert one(objs, "Service", "peering-entrance")["spec"]["type"] == "LoadBalancer"


def test_the_module_settings_override_the_global_ones(chart) -> None:
    objs = objects(chart, values({"https": {"mode": "CustomCertificate",
                                            "customCertificate": {"secretName": "own-tls"}},
                                  "ingressClass": "public"}, https=CERT_MANAGER, ingress_class="internet"))
    ingress = one(objs, "Ingress", "peering-join")
    assert ingress["spec"]["tls"][0]["secretName"] == "ingress-tls-customcertificate"
    assert ingress["spec"]["ingressClassName"] == "public"
    assert not [o for o in objs if o["kind"] == "Certificate"]
    assert one(objects(chart, values(ingress_class="internet")), "Ingress", "peering-join")["spec"][
        "ingressClassName"] == "internet"


def test_the_join_ingress_routes_only_the_join_endpoint_to_the_join_listener(chart) -> None:
    objs = objects(chart, values())
    [rule] = one(objs, "Ingress", "peering-join")["spec"]["rules"]
    assert rule["host"] == "peering.example.com"
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/v1/join", "Exact")
    service = one(objs, "Service", path["backend"]["service"]["name"])
    [port] = [p for p in service["spec"]["ports"] if p["name"] == path["backend"]["service"]["port"]["name"]]
    assert container_port(objs, port["targetPort"]) == 8080


def container_port(objs: list[dict], name: str, container: str = "peering") -> int:
    pod = one(objs, "Deployment", "peering")["spec"]["template"]["spec"]
    [c] = [c for c in pod["containers"] if c["name"] == container]
    [port] = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return port


@pytest.mark.parametrize("entrance", ENTRANCE)
def test_three_services_reach_three_listeners(chart, entrance: str) -> None:
    objs = objects(chart, values(ENTRANCE[entrance]))
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    pod_labels = one(objs, "Deployment", "peering")["spec"]["template"]["metadata"]["labels"]
    reached = {}
    for name, service in services.items():
        assert service["metadata"]["namespace"] == NAMESPACE
        assert service["spec"]["selector"].items() <= pod_labels.items(), name
        [port] = service["spec"]["ports"]
        reached[name] = (service["spec"]["type"], port["port"], container_port(objs, port["targetPort"]))
    entrance_type = "LoadBalancer" if entrance == "LoadBalancer" else "ClusterIP"
    # The ops listener has no Service: the kubelet probes the pod, Prometheus scrapes through kube-rbac-proxy.
    assert reached == {
        "peering-entrance": (entrance_type, 443, 8443),
        # The egress is reached as peering-gateway.d8-peering.svc (docs/internals.md).
        "peering-gateway": ("ClusterIP", 443, 9443),
        "peering-join": ("ClusterIP", 80, 8080),
    }


def test_the_passthrough_entrance_keeps_tls_intact_on_its_own_ingress_class(chart) -> None:
    objs = objects(chart, values(ENTRANCE["IngressNginxPassthrough"], ingress_class="nginx"))
    ingress = one(objs, "Ingress", "peering-entrance")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true"
    assert ingress["spec"]["ingressClassName"] == "passthrough"
    assert one(objs, "Ingress", "peering-join")["spec"]["ingressClassName"] == "nginx"
    assert "tls" not in ingress["spec"]
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "peering-gateway.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == "peering-entrance"
    # The NetworkPolicy lets the entrance be reached only by way of ingress-nginx then.
    [entrance_rule] = [r for r in one(objs, "NetworkPolicy", "peering")["spec"]["ingress"]
                       if r["ports"][0]["port"] == "entrance"]
    assert entrance_rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "d8-ingress-nginx"}}}]


def test_the_load_balancer_entrance_takes_annotations_and_source_ranges(chart) -> None:
    objs = objects(chart, values({"entrance": {"loadBalancer": {
        "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        "sourceRanges": ["203.0.113.0/24"]}}}))
    service = one(objs, "Service", "peering-entrance")
    assert service["metadata"]["annotations"] == {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}
    assert service["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


def test_the_network_policy_lets_in_only_what_reaches_each_listener(chart) -> None:
    objs = objects(chart, values())
    policy = one(objs, "NetworkPolicy", "peering")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    by_port = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert by_port == {
        "entrance": None,  # peers, from anywhere, with a client certificate of the peering CA
        "egress": [{"namespaceSelector": {}}],
        "join": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "d8-ingress-nginx"}}}],
        "https-metrics": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "d8-monitoring"}}}],
    }
    assert "ops" not in by_port


def test_the_deployment_runs_the_process_hardened(chart) -> None:
    objs = objects(chart, values({"peerSyncIntervalSeconds": 45, "logLevel": "Warning",
                                  "clientCertificateLifetimeSeconds": 7200}))
    deployment = one(objs, "Deployment", "peering")
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "peering")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["metadata"]["labels"]["heritage"] == "deckhouse"
    assert deployment["metadata"]["labels"]["module"] == "peering"
    assert deployment["spec"]["revisionHistoryLimit"] <= 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    assert pod["serviceAccountName"] == "peering"
    assert pod["priorityClassName"] == "cluster-medium"
    assert [container["command"][0], *container["args"]] == [
        "peering", "run", "--namespace", "d8-peering", "--public-domain-template", "%s.example.com",
        "--ops-port", "8081", "--entrance-port", "8443", "--egress-port", "9443", "--join-port", "8080",
    ]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {"PEERING_IDENTITY": {"fieldRef": {"fieldPath": "metadata.name"}},
                   "PEERING_DEX_URL": "https://dex.example.com",
                   "PEERING_PEER_SYNC_INTERVAL": "45", "PEERING_LOG_LEVEL": "WARNING",
                   "PEERING_TRUSTED_PROXIES": "10.111.0.0/16", "PEERING_CLIENT_CERT_LIFETIME": "7200",
                   "PEERING_SERVER_CERT_LIFETIME": "43200"}
    assert container["image"] == f"{deckhouse_module.DEFAULT_REGISTRY}@{deckhouse_module.FAKE_DIGEST}"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"]["path"] == path
        assert container_port(objs, container[probe]["httpGet"]["port"]) == 8081
    assert container["resources"]["requests"]["ephemeral-storage"]
    for c in pod["containers"]:
        security = c["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, c["name"]
        assert security["readOnlyRootFilesystem"] is True, c["name"]
        assert security["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert "ephemeral-storage" in c["resources"]["requests"], c["name"]
        assert "@sha256:" in c["image"], c["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 64535
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_metrics_are_served_as_https_metrics_behind_kube_rbac_proxy(chart) -> None:
    objs = objects(chart, values(enabled_modules=BASE_MODULES + OPTIONAL))
    pod = one(objs, "Deployment", "peering")["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "kube-rbac-proxy")
    assert proxy["image"].endswith("@" + deckhouse_module.FAKE_DIGEST)
    config = yaml.safe_load(next(e["value"] for e in proxy["env"] if e["name"] == "KUBE_RBAC_PROXY_CONFIG"))
    [upstream] = config["upstreams"]
    assert upstream["upstream"] == "http://127.0.0.1:8081/metrics"
    assert upstream["authorization"]["resourceAttributes"]["subresource"] == "prometheus-metrics"
    monitor = one(objs, "PodMonitor", "peering")
    assert monitor["metadata"]["namespace"] == "d8-monitoring"
    assert monitor["metadata"]["labels"]["prometheus"] == "main"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["scheme"]) == ("https-metrics", "https")
    assert container_port(objs, "https-metrics", "kube-rbac-proxy") > 1024
    assert monitor["spec"]["selector"]["matchLabels"].items() <= one(objs, "Deployment", "peering")["spec"][
        "template"]["metadata"]["labels"].items()
    namespace = one(objs, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["prometheus.deckhouse.io/rules-watcher-enabled"] == "true"
    assert one(objs, "ConfigMap", "kube-rbac-proxy-ca.crt")["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("ha", [False, True])
def test_replicas_and_spread_follow_high_availability(chart, ha: bool) -> None:
    for vals in (values(high_availability=ha), values({"highAvailability": ha}, high_availability=not ha)):
        deployment = one(objects(chart, vals), "Deployment", "peering")
        pod = deployment["spec"]["template"]["spec"]
        assert deployment["spec"]["replicas"] == (2 if ha else 1)
        if ha:
            [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert term["topologyKey"] == "kubernetes.io/hostname"
            assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
            # Two nodes, two replicas, required spread: a surge pod would have nowhere to go.
            assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        else:
            assert "affinity" not in pod
            assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


STORAGE_PROBLEMS = [{"key": "drbd.linbit.com/lost-quorum"}, {"key": "drbd.linbit.com/force-io-error"},
                    {"key": "drbd.linbit.com/ignore-fail-over"}]
DEDICATED = [{"key": "dedicated.deckhouse.io", "operator": "Equal", "value": "peering"},
             {"key": "dedicated.deckhouse.io", "operator": "Equal", "value": "system"}]


def _pod(chart, vals: dict) -> dict:
    return one(objects(chart, vals), "Deployment", "peering")["spec"]["template"]["spec"]


def _with_nodes(vals: dict, **by_role: int) -> dict:
    vals["global"]["discovery"]["d8SpecificNodeCountByRole"] = dict(by_role)
    return vals


@pytest.mark.parametrize(("by_role", "selector"), [
    ({}, None),
    ({"system": 2}, {"node-role.deckhouse.io/system": ""}),
    ({"peering": 2}, {"node-role.deckhouse.io/peering": ""}),
    ({"peering": 2, "system": 3}, {"node-role.deckhouse.io/peering": ""}),
], ids=["no-dedicated-nodes", "system-nodes", "peering-nodes", "peering-before-system"])
def test_placement_prefers_the_modules_own_nodes_then_the_system_nodes(chart, by_role, selector) -> None:
    """As helm_lib's system strategy: node-role.deckhouse.io/peering where such nodes exist, else .../system, and
    the tolerations of both dedicated taints and of DRBD's storage problems."""
    pod = _pod(chart, _with_nodes(values(), **by_role))
    assert pod.get("nodeSelector") == selector
    assert pod["tolerations"] == DEDICATED + STORAGE_PROBLEMS


def test_placement_settings_replace_the_dedicated_nodes(chart) -> None:
    pod = _pod(chart, _with_nodes(values({"nodeSelector": {"pool": "peering"},
                                          "tolerations": [{"key": "pool", "operator": "Exists"}]}), peering=2))
    assert pod["nodeSelector"] == {"pool": "peering"}
    assert pod["tolerations"] == [{"key": "pool", "operator": "Exists"}] + STORAGE_PROBLEMS


def test_resources_follow_the_settings_and_bound_the_vpa(chart) -> None:
    objs = objects(chart, values({"resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                                "limits": {"cpu": "2", "memory": "1Gi"}}},
                                 enabled_modules=BASE_MODULES + OPTIONAL))
    container = one(objs, "Deployment", "peering")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    vpa = one(objs, "VerticalPodAutoscaler", "peering")
    assert vpa["spec"]["targetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "peering"}
    assert vpa["spec"]["updatePolicy"]["updateMode"] in ("Off", "Initial", "Recreate", "InPlaceOrRecreate")
    policies = {p["containerName"]: p for p in vpa["spec"]["resourcePolicy"]["containerPolicies"]}
    assert set(policies) == {"peering", "kube-rbac-proxy"}
    assert policies["peering"]["maxAllowed"] == {"cpu": "2", "memory": "1Gi"}


def test_the_disruption_budget_covers_the_pods(chart) -> None:
    objs = objects(chart, values())
    pdb = one(objs, "PodDisruptionBudget", "peering")
    pod_labels = one(objs, "Deployment", "peering")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_dex_client_is_the_one_the_process_reads(chart) -> None:
    """DexClient peering in d8-peering, trusted by kubernetes: user-authn then writes dex-client-peering."""
    dex_client = one(objects(chart, values()), "DexClient", "peering")
    assert dex_client["apiVersion"] == "deckhouse.io/v1"
    assert dex_client["metadata"]["namespace"] == NAMESPACE
    assert dex_client["metadata"]["annotations"] == {"dexclient.deckhouse.io/allow-access-to-kubernetes": "true"}
    assert not [o for o in objects(chart, values(enabled_modules=("cert-manager",))) if o["kind"] == "DexClient"]


def test_every_object_carries_the_module_labels_and_lives_where_it_should(chart) -> None:
    objs = objects(chart, values(ENTRANCE["IngressNginxPassthrough"], enabled_modules=BASE_MODULES + OPTIONAL,
                                 kubernetes_version="1.37.2"))
    assert "MutatingAdmissionPolicy" in {o["kind"] for o in objs}
    for obj in objs:
        labels = obj["metadata"].get("labels", {})
        assert (labels.get("heritage"), labels.get("module")) == ("deckhouse", "peering"), obj["metadata"]["name"]
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                      "GrafanaDashboardDefinition"}
    where = {(o["kind"], o["metadata"]["name"]): o["metadata"].get("namespace") for o in objs
             if o["kind"] not in cluster_scoped}
    assert {k: ns for k, ns in where.items() if ns != NAMESPACE} == {
        ("Role", "d8:peering:cluster-uuid"): "kube-system",
        ("RoleBinding", "d8:peering:cluster-uuid"): "kube-system",
        ("PodMonitor", "peering"): "d8-monitoring",
    }


# --- values the module cannot work with ---------------------------------------------------------------------

BAD_VALUES = [
    pytest.param({}, {"public_domain_template": ""},
                 ["global.modules.publicDomainTemplate is not set", 'such as "%s.example.com"'], id="no-template"),
    pytest.param({}, {"public_domain_template": "example.com"},
                 ['global.modules.publicDomainTemplate "example.com" has no %s'], id="template-no-%s"),
    pytest.param({}, {"public_domain_template": "%s.%s.example.com"},
                 ['"%s.%s.example.com" has %s 2 times', "exactly once"], id="template-two-%s"),
    pytest.param({}, {"public_domain_template": "%s.Example_com"},
                 ['makes "peering.Example_com", which is not a DNS name'], id="template-not-dns"),
    pytest.param({"https": {"mode": "Disabled"}}, {},
                 ['peering.https.mode is "Disabled", which the peering module cannot work with',
                  "CertManager or CustomCertificate"], id="https-disabled"),
    pytest.param({}, {"https": {"mode": "OnlyInURI"}},
                 ['global.modules.https.mode is "OnlyInURI", which the peering module cannot work with',
                  "set https.mode of the peering ModuleConfig (or global.modules.https.mode) to CertManager or "
                  "CustomCertificate"], id="global-https-only-in-uri"),
    pytest.param({}, {"https": {"mode": "CustomCertificate"}},
                 ["https.customCertificate.secretName is not set", "kubernetes.io/tls Secret in d8-system"],
                 id="custom-certificate-without-secret"),
    pytest.param({}, {"enabled_modules": ("user-authn",)},
                 ["is CertManager but the cert-manager module is disabled"], id="cert-manager-disabled"),
    pytest.param({"entrance": {"mode": "IngressNginxPassthrough"}}, {},
                 ["peering.entrance.ingressNginx.ingressClass is not set", "LoadBalancerWithSSLPassthrough"],
                 id="passthrough-without-class"),
]


@pytest.mark.parametrize(("settings", "global_kw", "expected"), BAD_VALUES)
def test_values_the_module_cannot_use_fail_rendering_with_what_to_set(chart, settings, global_kw, expected) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        objects(chart, values(settings, **global_kw))
    for text in expected:
        assert text in str(failure.value)


def test_a_custom_certificate_secret_that_the_hook_did_not_find_fails_with_its_name(chart) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        objects(chart, values(https=CUSTOM_CERTIFICATE, internal={}))
    assert "d8-system/example-com-tls was not found" in str(failure.value)


def _env(objs: list[dict], name: str) -> str:
    container = one(objs, "Deployment", "peering")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}[name]


def test_the_join_limit_trusts_the_ingress_controllers_by_the_pod_subnet_or_the_setting(chart) -> None:
    """X-Forwarded-For counts only from the Ingress controllers: by default the pod subnet, which the NetworkPolicy
    narrows to d8-ingress-nginx's pods on the join port; the setting names other addresses (host-network ones)."""
    assert _env(objects(chart, values()), "PEERING_TRUSTED_PROXIES") == "10.111.0.0/16"
    named = objects(chart, values({"joinTrustedProxies": ["192.0.2.0/24", "198.51.100.7"]}))
    assert _env(named, "PEERING_TRUSTED_PROXIES") == "192.0.2.0/24,198.51.100.7"
    with pytest.raises(deckhouse_module.SettingsError, match=r"^settings\.joinTrustedProxies\.0: "):
        deckhouse_module.settings_values({"joinTrustedProxies": ["the ingress"]})


# --- high availability as Deckhouse decides it -----------------------------------------------------------------

@pytest.mark.parametrize(("masters", "replicas"), [(1, 1), (3, 2)])
def test_high_availability_follows_the_control_plane_when_nobody_set_it(chart, masters: int, replicas: int) -> None:
    """No highAvailability in the ModuleConfig and none in global: a three-master cluster's control plane is highly
    available (global.discovery), and so is the module: two replicas on two nodes and a disruption budget."""
    objs = objects(chart, discovered_ha(values(), masters))
    for version in KUBE_VERSIONS:
        assert validate_all(objs, version) <= FOREIGN
    deployment = one(objs, "Deployment", "peering")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == replicas
    if replicas > 1:
        [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= pod_labels(objs).items()
    else:
        assert "affinity" not in pod
    pdb = one(objs, "PodDisruptionBudget", "peering")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(
        objs).items()


def test_a_set_high_availability_wins_over_the_control_plane(chart) -> None:
    three_masters = discovered_ha(values({"highAvailability": False}), 3)
    assert one(objects(chart, three_masters), "Deployment", "peering")["spec"]["replicas"] == 1
    one_master = discovered_ha(values(), 1)
    one_master["global"]["highAvailability"] = True
    assert one(objects(chart, one_master), "Deployment", "peering")["spec"]["replicas"] == 2


def pod_labels(objs: list[dict]) -> dict:
    return one(objs, "Deployment", "peering")["spec"]["template"]["metadata"]["labels"]


# --- where the image comes from ---------------------------------------------------------------------------------

def test_an_embedded_module_pulls_from_deckhouses_registry(chart) -> None:
    objs = objects(chart, values())
    pod = one(objs, "Deployment", "peering")["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in pod["containers"]}
    assert images["peering"] == f"{deckhouse_module.DEFAULT_REGISTRY}@{deckhouse_module.FAKE_DIGEST}"
    assert pod["imagePullSecrets"] == [{"name": "deckhouse-registry"}]
    assert not [o for o in objs if o["kind"] == "Secret" and o["type"] == "kubernetes.io/dockerconfigjson"]


def test_a_module_from_a_module_source_pulls_from_its_own_registry_with_its_credentials(chart) -> None:
    objs = objects(chart, external(values(), base="registry.example.com/modules/", dockercfg="eyJhdXRocyI6e319"))
    pod = one(objs, "Deployment", "peering")["spec"]["template"]["spec"]
    images = {c["name"]: c["image"] for c in pod["containers"]}
    # <source registry>/<module name>@<digest>, the module's path under the source.
    assert images["peering"] == f"registry.example.com/modules/peering@{deckhouse_module.FAKE_DIGEST}"
    # kube-rbac-proxy stays one of Deckhouse's common images.
    assert images["kube-rbac-proxy"].startswith(deckhouse_module.DEFAULT_REGISTRY + "@")
    secret = one(objs, "Secret", "peering-module-registry")
    assert secret["type"] == "kubernetes.io/dockerconfigjson" and secret["metadata"]["namespace"] == NAMESPACE
    assert secret["data"] == {".dockerconfigjson": "eyJhdXRocyI6e319"}
    assert pod["imagePullSecrets"] == [{"name": "deckhouse-registry"}, {"name": "peering-module-registry"}]


PACKAGE_TEMPLATE = """{{- $root := dict "Values" .Values "Chart" .Chart "Module" .Values.renderedAs }}
image: {{ include "peering.image" (list $root "peering") | quote }}
dockercfg: {{ include "peering.moduleRegistryDockercfg" $root | quote }}
"""


def render_as_deckhouse(tmp_path, vals: dict, module: dict | None) -> dict:
    """The module's helpers with `.Module` beside `.Values`, as current Deckhouse renders a module from its package:
    a chart of the module's _helpers.tpl and one template that hands them such a root."""
    chart_dir = tmp_path / "package-render"
    (chart_dir / "templates").mkdir(parents=True, exist_ok=True)
    (chart_dir / "Chart.yaml").write_text("apiVersion: v2\nname: peering\nversion: 0.1.0\n")
    (chart_dir / "templates" / "_helpers.tpl").write_text((CHART_DIR / "templates" / "_helpers.tpl").read_text())
    (chart_dir / "templates" / "out.yaml").write_text(PACKAGE_TEMPLATE)
    with helm.Chart.load(chart_dir) as loaded:
        rendered = loaded.render({**vals, "renderedAs": module}, name="peering", namespace=NAMESPACE)
    return yaml.safe_load(rendered["peering/templates/out.yaml"])


def test_a_module_package_names_the_registry_repository_and_the_digest(tmp_path) -> None:
    package = {"Package": {"Name": "peering", "Registry": {"repository": "registry.example.com/packages",
                                                          "dockercfg": "cGFja2FnZQ=="},
                           "Digests": {"peering": "sha256:" + "a" * 64}}}
    out = render_as_deckhouse(tmp_path, external(values()), package)
    assert out == {"image": "registry.example.com/packages/peering@sha256:" + "a" * 64, "dockercfg": "cGFja2FnZQ=="}
    # Without a package, the same helpers read the values as before.
    assert render_as_deckhouse(tmp_path, values(), None)["image"] == (
        f"{deckhouse_module.DEFAULT_REGISTRY}@{deckhouse_module.FAKE_DIGEST}")
    broken = {"Package": {"Name": "peering", "Registry": {"repository": "registry.example.com/packages"},
                          "Digests": {}}}
    with pytest.raises(helm.HelmRenderError, match='has no registry repository or no digest of the image "peering"'):
        render_as_deckhouse(tmp_path, values(), broken)


# --- the join endpoint behind every ingress-nginx inlet ---------------------------------------------------------

POD_SUBNET = "10.111.0.0/16"
NODE_NETWORK = "192.168.10.0/24"
# Where each IngressNginxController inlet's controller connects to a backend from: its pod (in d8-ingress-nginx)
# or, for the primary controller of HostWithFailover (hostNetwork: true), its node's address.
INLETS = {
    "LoadBalancer": ("pod", "10.111.4.7"),
    "LoadBalancerWithProxyProtocol": ("pod", "10.111.4.8"),
    "LoadBalancerWithSSLPassthrough": ("pod", "10.111.4.9"),
    "HostPort": ("pod", "10.111.5.1"),
    "HostPortWithProxyProtocol": ("pod", "10.111.5.2"),
    "HostPortWithSSLPassthrough": ("pod", "10.111.5.3"),
    "HostWithFailover": ("node", "192.168.10.21"),
    "HostWithFailover-failover": ("pod", "10.111.6.1"),
}


def admits(policy: dict, port: str, *, namespace: str | None, ip: str) -> bool:
    """Whether the NetworkPolicy lets a connection to `port` in: from a pod of `namespace` (None: not a pod, a node
    or an outside address) at address `ip`."""
    import ipaddress

    for rule in policy["spec"]["ingress"]:
        if port not in [p["port"] for p in rule["ports"]]:
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            selector = peer.get("namespaceSelector")
            if selector is not None and namespace is not None and selector.get("matchLabels", {}).items() <= {
                    "kubernetes.io/metadata.name": namespace}.items():
                return True
            block = peer.get("ipBlock")
            if block and ipaddress.ip_address(ip) in ipaddress.ip_network(block["cidr"]) and not any(
                    ipaddress.ip_address(ip) in ipaddress.ip_network(e) for e in block.get("except", [])):
                return True
    return False


def inlet_settings(inlet: str) -> dict:
    """What the module's docs tell an administrator to set for the inlet: the node network for a controller in the
    host network, nothing otherwise."""
    return {"joinNodeNetworks": [NODE_NETWORK]} if INLETS[inlet][0] == "node" else {}


@pytest.mark.parametrize("inlet", INLETS)
def test_a_join_through_each_inlet_reaches_the_join_listener(chart, inlet: str) -> None:
    where, ip = INLETS[inlet]
    objs = objects(chart, values(inlet_settings(inlet)))
    for version in KUBE_VERSIONS:
        assert validate_all(objs, version) <= FOREIGN
    policy = one(objs, "NetworkPolicy", "peering")
    namespace = "d8-ingress-nginx" if where == "pod" else None
    assert admits(policy, "join", namespace=namespace, ip=ip)
    # Still nothing else: neither another namespace's pods nor an address outside the named networks.
    assert not admits(policy, "join", namespace="default", ip="10.111.9.9")
    assert not admits(policy, "join", namespace=None, ip="203.0.113.5")
    # The node network opens the join listener only, never the egress or the ops listener.
    assert not admits(policy, "egress", namespace=None, ip=NODE_NETWORK.replace("0/24", "21"))
    assert not admits(policy, "ops", namespace=None, ip=NODE_NETWORK.replace("0/24", "21"))


def test_a_host_network_controller_is_dropped_without_its_node_network(chart) -> None:
    """Today's failure mode, kept visible: without joinNodeNetworks the primary HostWithFailover controller cannot
    join, whatever else is set."""
    policy = one(objects(chart, values()), "NetworkPolicy", "peering")
    assert not admits(policy, "join", namespace=None, ip=INLETS["HostWithFailover"][1])


def test_the_node_networks_are_trusted_for_the_client_address_and_admitted_to_join_only(chart) -> None:
    objs = objects(chart, values({"joinNodeNetworks": [NODE_NETWORK, "fd00:10::/64"]}))
    assert _env(objs, "PEERING_TRUSTED_PROXIES") == f"{POD_SUBNET},{NODE_NETWORK},fd00:10::/64"
    policy = one(objs, "NetworkPolicy", "peering")
    blocks = {r["ports"][0]["port"]: [p["ipBlock"]["cidr"] for p in r.get("from", []) if "ipBlock" in p]
              for r in policy["spec"]["ingress"]}
    assert blocks == {"entrance": [], "egress": [], "join": [NODE_NETWORK, "fd00:10::/64"], "https-metrics": []}
    with pytest.raises(deckhouse_module.SettingsError, match=r"^settings\.joinNodeNetworks\.0: "):
        deckhouse_module.settings_values({"joinNodeNetworks": ["192.168.10.21"]})
