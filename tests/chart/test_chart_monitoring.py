"""Every alert expression and dashboard query names a metric the process really exports. The exported names are
read from the code: the gateway's registry (gateway/metrics.py) is started and the control loop's modules are
imported, and the families of both registries listed with the suffixes the Prometheus client adds (`_total` on
counters, `_bucket`/`_sum`/`_count` on histograms), with those the control loop computes at each scrape
(control/metrics.py), so a metric another part adds is known here at once. The alerts an administrator must act
on are each there."""

from __future__ import annotations

import importlib
import json
import pathlib
import pkgutil
import re

import prometheus_client
import yaml

from chart_paths import CHART_DIR

RULES = CHART_DIR / "monitoring" / "prometheus-rules"
DASHBOARDS = CHART_DIR / "monitoring" / "grafana-dashboards"
REPO = CHART_DIR.parent.parent
# A metric name in a PromQL expression: a word followed by {, [ or whitespace/) that is not a function, keyword,
# label name or grafana variable.
PROMQL_WORDS = {"sum", "rate", "increase", "by", "without", "and", "or", "unless", "histogram_quantile", "on",
                "ignoring", "group_left", "group_right", "avg", "max", "min", "count", "label_values", "absent",
                "bool", "offset", "topk", "bottomk", "irate", "delta", "humanizePercentage"}


def exported_names() -> set[str]:
    for package in ("control", "gateway"):
        mod = importlib.import_module(package)
        for info in pkgutil.walk_packages(mod.__path__, f"{package}."):
            importlib.import_module(info.name)
    from control.metrics import ControlCollector
    from gateway.metrics import Metrics

    names: set[str] = set()
    # The control loop's scrape-time collector announces its families (`describe`), the ones `collect` fills.
    names |= {family.name for family in ControlCollector(None, "d8-peering", leading=lambda: False).describe()}
    for registry in (Metrics().registry, prometheus_client.REGISTRY):
        for family in registry.collect():
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
            else:
                names.add(family.name)
    return {n for n in names if n.startswith("peering_")}


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}", "{}", expr)        # label matchers
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)       # ranges
    expr = re.sub(r"\([^()]*?\bby\b", "(", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    label_lists = set(re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr))
    labels = {w.strip() for group in label_lists for w in group.split(",")}
    return {w for w in words if w.startswith("peering_")} | {
        w for w in words - PROMQL_WORDS - labels if not w.startswith("__") and "_" in w and w.islower()
        and not w.startswith("peering_")}


def alert_expressions() -> list[tuple[str, str]]:
    out = []
    for path in sorted(RULES.rglob("*.yaml")):
        for group in yaml.safe_load(path.read_text()):
            for rule in group["rules"]:
                out.append((rule.get("alert") or rule.get("record"), rule["expr"]))
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted(DASHBOARDS.rglob("*.json")):
        dash = json.loads(path.read_text())
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                out.append((panel["title"], target["expr"]))
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                out.append((var["name"], var["query"]["query"]))
    return out


def test_the_exported_names_are_read_from_the_code() -> None:
    names = exported_names()
    assert {"peering_gateway_requests_total", "peering_reconciles_total",
            "peering_gateway_dex_seconds_bucket"} <= names
    assert "peering_gateway_requests" not in names  # a counter is exported with _total only


def test_the_extraction_sees_every_metric_of_an_expression() -> None:
    expr = ('sum by (peer) (rate(peering_a_total{code="4xx"}[5m])) / histogram_quantile(0.9, '
            'sum by (le) (rate(peering_b_bucket[5m]))) and up')
    assert metric_names(expr) == {"peering_a_total", "peering_b_bucket"}


def test_every_alert_names_only_exported_metrics() -> None:
    names = exported_names()
    exprs = alert_expressions()
    assert len(exprs) >= 5
    for alert, expr in exprs:
        used = metric_names(expr)
        assert used, f"{alert} names no metric"
        assert used <= names, f"{alert} names {sorted(used - names)}, which the process does not export"


def test_every_dashboard_query_names_only_exported_metrics() -> None:
    names = exported_names()
    queries = dashboard_queries()
    assert len(queries) >= 10
    for title, expr in queries:
        used = metric_names(expr)
        assert used, f"{title!r} names no metric"
        assert used <= names, f"{title!r} names {sorted(used - names)}, which the process does not export"


def test_every_alert_says_what_to_do() -> None:
    for path in sorted(RULES.rglob("*.yaml")):
        for group in yaml.safe_load(path.read_text()):
            for rule in group["rules"]:
                annotations = rule["annotations"]
                assert annotations["summary"] and "What to do" in annotations["description"], rule["alert"]
                assert rule["labels"]["severity_level"] and rule.get("for"), rule["alert"]


def _rules() -> dict[str, dict]:
    out = {}
    for path in sorted(RULES.rglob("*.yaml")):
        for group in yaml.safe_load(path.read_text()):
            for rule in group["rules"]:
                out[rule["alert"]] = rule
    return out


def test_the_control_loops_scraped_metrics_are_known():
    names = exported_names()
    assert {"peering_leader", "peering_peer_ready", "peering_peer_ready_info",
            "peering_peer_last_sync_timestamp_seconds", "peering_certificate_expiry_timestamp_seconds",
            "peering_certificate_renewal_timestamp_seconds", "peering_events_total",
            "peering_gateway_token_exchange_failures_total"} <= names


def test_the_alerts_an_administrator_must_act_on_are_there():
    rules = _rules()
    # A peering not Ready for 15 minutes, with its reason in the text.
    not_ready = rules["D8PeeringNotReady"]
    assert "peering_peer_ready" in not_ready["expr"] and not_ready["for"] == "15m"
    assert 'label "reason"' in not_ready["annotations"]["description"]
    # A certificate near expiry: judged against its own renewal time, whatever its lifetime.
    expiry = rules["D8PeeringCertificateExpiresSoon"]["expr"]
    assert "peering_certificate_expiry_timestamp_seconds" in expiry
    assert "peering_certificate_renewal_timestamp_seconds" in expiry
    # Token exchanges failing, by reason.
    exchange = rules["D8PeeringTokenExchangeFailing"]
    assert "peering_gateway_token_exchange_failures_total" in exchange["expr"] and "reason" in exchange["expr"]
    # The gateway refusing or failing an unusual share of requests.
    # Only the gateway's own answers count (accounting.OUTCOMES): never an API server's 4xx, nor a stream its
    # client ended; tests/e2e/test_alerts.py evaluates them over a lab run.
    assert 'outcome="refused", code="4xx"' in rules["D8PeeringGatewayRefusingRequests"]["expr"]
    assert 'outcome=~"refused|error", code="5xx"' in rules["D8PeeringGatewayFailingRequests"]["expr"]
    # No leader, also when no replica is scraped at all.
    no_leader = rules["D8PeeringNoLeader"]["expr"]
    assert "peering_leader" in no_leader and "absent(" in no_leader


def test_the_dashboard_shows_peerings_by_state_and_reason_and_certificate_expiry():
    titles: dict[str, str] = {}
    for title, expr in dashboard_queries():
        titles[title] = titles.get(title, "") + " " + expr
    assert "peering_peer_ready_info" in titles["Peerings by state and reason"]
    assert "peering_certificate_expiry_timestamp_seconds" in titles["Certificate expiry (time left)"]
    assert "peering_peer_last_sync_timestamp_seconds" in titles["Time since the last sync by peer"]
