"""The monitoring objects as Deckhouse's modules ship them (helm_lib's monitoring helpers and multitenancy-manager's
PodMonitor): PrometheusRules only with prometheus-operator's CRDs (operator-prometheus-crd), dashboards only with the
monitoring CRDs (prometheus-crd), each labelled for what selects it (the rules watcher, Deckhouse's Grafana), the
dashboard in the Grafana folder its directory names, the scrape limited to ready replicas of the cluster tier, and
the observability module's objects instead of (rules) or beside (dashboards) them where that module is enabled."""

from __future__ import annotations

import helm_python as helm
import pytest

from chart_paths import CHART_DIR
from module_values import BASE_MODULES, FOREIGN, KUBE_VERSIONS, objects, one, validate_all, values

OPERATOR = ("operator-prometheus", "operator-prometheus-crd")
GRAFANA = ("prometheus", "prometheus-crd")
OBSERVABILITY_RULES = "observability.deckhouse.io/v1alpha1/ClusterObservabilityMetricsRulesGroup"


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def monitoring(objs: list[dict]) -> list[str]:
    kinds = {"PrometheusRule", "GrafanaDashboardDefinition", "PodMonitor", "ClusterObservabilityMetricsRulesGroup",
             "ClusterObservabilityDashboard"}
    return sorted(o["kind"] for o in objs if o["kind"] in kinds)


@pytest.mark.parametrize(("modules", "expected"), [
    ((), []),
    # The operator without its CRDs' module: no PrometheusRule (it would not apply), the PodMonitor as before.
    (("operator-prometheus",), ["PodMonitor"]),
    (OPERATOR, ["PodMonitor", "PrometheusRule"]),
    # Prometheus without the CRDs' module: no dashboard.
    (("prometheus",), []),
    (GRAFANA, ["GrafanaDashboardDefinition"]),
], ids=["none", "operator-only", "operator-and-crd", "prometheus-only", "prometheus-and-crd"])
def test_each_object_is_guarded_by_the_module_of_its_crd(chart, modules, expected) -> None:
    assert monitoring(objects(chart, values(enabled_modules=BASE_MODULES + modules))) == expected


def test_rules_carry_what_the_rules_watcher_selects_and_the_scrape_interval(chart) -> None:
    vals = values(enabled_modules=BASE_MODULES + OPERATOR)
    vals["global"]["discovery"]["prometheusScrapeInterval"] = 15
    objs = objects(chart, vals)
    rule = one(objs, "PrometheusRule", "peering-peering")
    assert rule["metadata"]["namespace"] == "d8-peering"
    assert {k: rule["metadata"]["labels"][k] for k in ("app", "prometheus", "component", "heritage", "module")} == {
        "app": "prometheus", "prometheus": "main", "component": "rules", "heritage": "deckhouse", "module": "peering"}
    assert one(objs, "Namespace", "d8-peering")["metadata"]["labels"][
        "prometheus.deckhouse.io/rules-watcher-enabled"] == "true"
    text = str(rule["spec"])
    assert "__SCRAPE_INTERVAL" not in text
    assert [g["name"] for g in rule["spec"]["groups"]] == ["d8.peering.gateway", "d8.peering.controller",
                                                           "d8.peering.peerings"]


def test_the_dashboard_is_in_the_folder_its_directory_names_and_labelled_for_grafana(chart) -> None:
    [path] = sorted((CHART_DIR / "monitoring" / "grafana-dashboards").rglob("*.json"))
    folder = path.parent.name
    objs = objects(chart, values(enabled_modules=BASE_MODULES + GRAFANA))
    dashboard = one(objs, "GrafanaDashboardDefinition", f"d8-peering-{folder}-{path.stem}")
    assert dashboard["spec"]["folder"] == folder.replace("-", " ").title() == "Peering"
    labels = dashboard["metadata"]["labels"]
    assert labels["prometheus.deckhouse.io/grafana-dashboard"] == ""
    assert labels["observability.deckhouse.io/skip-dashboard-conversion"] == ""
    assert dashboard["spec"]["definition"].strip() == path.read_text().strip()


def test_the_pod_monitor_scrapes_ready_replicas_of_the_cluster_tier(chart) -> None:
    monitor = one(objects(chart, values(enabled_modules=BASE_MODULES + OPERATOR)), "PodMonitor", "peering")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert {"targetLabel": "tier", "replacement": "cluster"} in endpoint["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_ready"], "regex": "true", "action": "keep"} in endpoint[
        "relabelings"]


def test_with_the_observability_module_its_objects_carry_the_rules_and_the_dashboard(chart) -> None:
    vals = values(enabled_modules=BASE_MODULES + OPERATOR + GRAFANA + ("observability",))
    vals["global"]["discovery"]["apiVersions"] = [OBSERVABILITY_RULES]
    objs = objects(chart, vals)
    for version in KUBE_VERSIONS:
        assert validate_all(objs, version) <= FOREIGN
    assert not [o for o in objs if o["kind"] == "PrometheusRule"]
    groups = [o for o in objs if o["kind"] == "ClusterObservabilityMetricsRulesGroup"]
    rule = one(objects(chart, values(enabled_modules=BASE_MODULES + OPERATOR)), "PrometheusRule", "peering-peering")
    assert [g["metadata"]["name"] for g in groups] == [f"peering-peering-{i}" for i in range(len(
        rule["spec"]["groups"]))]
    # The same rules, group by group, without the group's name (the object's name stands for it).
    assert [g["spec"] for g in groups] == [{k: v for k, v in group.items() if k != "name"}
                                           for group in rule["spec"]["groups"]]
    assert all("namespace" not in g["metadata"] for g in groups)
    dashboard = [o for o in objs if o["kind"] == "ClusterObservabilityDashboard"]
    [definition] = [o for o in objs if o["kind"] == "GrafanaDashboardDefinition"]
    assert [d["metadata"]["name"] for d in dashboard] == [definition["metadata"]["name"]]
    assert dashboard[0]["metadata"]["annotations"]["metadata.deckhouse.io/category"] == definition["spec"]["folder"]
    assert dashboard[0]["metadata"]["labels"]["observability.deckhouse.io/dashboard-origin"] == "module"
    # The module alone, without its API served yet, keeps the PrometheusRules.
    del vals["global"]["discovery"]["apiVersions"]
    assert [o["kind"] for o in objects(chart, vals) if o["kind"] == "PrometheusRule"] == ["PrometheusRule"]
