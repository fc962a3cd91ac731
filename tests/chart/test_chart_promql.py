"""Every alert expression and every dashboard query parses as PromQL, by Prometheus's own parser: promtool, built from
the pinned prometheus Go module by `python -m lab.real build` (lab/real/gomod/promtool). The PrometheusRules are
checked as the module renders them (`promtool check rules`, which also checks the rules' shape and templates); the
dashboard's queries, with Grafana's variables put in, are checked as recording rules of a generated file. Without
promtool the tests skip loudly, and fail instead when PEERING_REQUIRE_REAL_APISERVER=1 (CI)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from chart_paths import CHART_DIR
from module_values import BASE_MODULES, objects, values
from lab.testing import promtool_or_skip

DASHBOARDS = CHART_DIR / "monitoring" / "grafana-dashboards"
# Grafana's interval variables as a query would get them; any other variable (a dashboard's own, such as $peer,
# always inside a label matcher's string) as a regular expression that matches every value.
INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600"}


@pytest.fixture(scope="module")
def promtool() -> str:
    return promtool_or_skip("PROMQL NOT PARSED")


def check_rules(promtool: str, groups: list[dict], tmp_path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def rendered_rule_groups() -> list[dict]:
    objs = objects(None, values(enabled_modules=BASE_MODULES + ("operator-prometheus", "operator-prometheus-crd")))
    groups = [g for o in objs if o["kind"] == "PrometheusRule" for g in o["spec"]["groups"]]
    assert groups, "the module rendered no PrometheusRule"
    return groups


def grafana_to_promql(query: str) -> str:
    """A dashboard query as Prometheus receives it: label_values(<selector>, <label>) asks for <selector>'s series,
    and every variable is replaced by what Grafana would send."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query, flags=re.S)
    if m:
        query = m.group(1)

    def variable(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return INTERVALS.get(name, ".*")

    return re.sub(r"\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)", variable, query)


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted(DASHBOARDS.rglob("*.json")):
        dashboard = json.loads(path.read_text())
        panels = list(dashboard.get("panels", []))
        while panels:
            panel = panels.pop()
            panels += panel.get("panels", [])
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((f"{path.stem}: {panel.get('title')}", target["expr"]))
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("type") == "query":
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                out.append((f"{path.stem}: ${var['name']}", query))
    return out


def as_recording_rules(queries: list[tuple[str, str]]) -> list[dict]:
    return [{"name": "dashboard-queries", "rules": [
        {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(expr), "labels": {"panel": title[:60]}}
        for i, (title, expr) in enumerate(queries)]}]


def test_every_rendered_alert_passes_promtool_check_rules(promtool, tmp_path) -> None:
    proc = check_rules(promtool, rendered_rule_groups(), tmp_path, "alerts")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"SUCCESS: (\d+) rules found", proc.stdout)
    assert found and int(found.group(1)) == sum(len(g["rules"]) for g in rendered_rule_groups()), proc.stdout


def test_every_dashboard_query_parses_as_promql(promtool, tmp_path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 10
    for _, expr in queries:
        assert "$" not in grafana_to_promql(expr), expr
    proc = check_rules(promtool, as_recording_rules(queries), tmp_path, "dashboards")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("broken", [
    "sum(rate(peering_gateway_requests_total[5m])",                  # an unclosed parenthesis
    "rate(peering_gateway_requests_total[5 minutes])",               # not a duration
    "peering_gateway_requests_total{code=~\"5xx}",                   # an unclosed string
    "sum by (peer) peering_peer_ready",                               # an aggregation without its argument
])
def test_a_broken_expression_fails_both_checks(promtool, tmp_path, broken: str) -> None:
    """The checks above can fail: a broken alert fails `check rules`, and so does a broken dashboard query."""
    [group] = rendered_rule_groups()[:1]
    alert = dict(group["rules"][0], expr=broken)
    proc = check_rules(promtool, [dict(group, rules=[alert])], tmp_path, "broken-alert")
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr, proc.stdout
    proc = check_rules(promtool, as_recording_rules([("broken panel", broken)]), tmp_path, "broken-dashboard")
    assert proc.returncode != 0, proc.stdout


def test_grafana_variables_become_what_grafana_sends() -> None:
    assert grafana_to_promql('sum(rate(x{peer=~"$peer"}[$__rate_interval]))') == 'sum(rate(x{peer=~".*"}[5m]))'
    assert grafana_to_promql('x{ds="${ds_prometheus}"}[${__range}]') == 'x{ds=".*"}[1h]'
    assert grafana_to_promql("label_values(peering_peer_ready, peer)") == "peering_peer_ready"


def test_the_promtool_location_is_discoverable(promtool, capsys) -> None:
    """`python -m lab.real paths` names promtool once it is built, for whoever evaluates the alerts next."""
    from lab.real.__main__ import main

    if main(["paths"]) != 0:
        pytest.skip("the control plane's binaries are not built, so `paths` reports nothing")
    assert json.loads(capsys.readouterr().out)["promtool"] == promtool
