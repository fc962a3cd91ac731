"""The module's alerts evaluated over what a lab peering process exports, by Prometheus's own rule evaluator:
`promtool test rules` (built by `python -m lab.real build`; `lab.real.build.promtool()`).

Two scrapes of a process's /metrics, at the start and the end of a run, become the series a Prometheus scraping
it every `STEP` seconds would have stored had the run gone on for `SPAN` seconds at the same rates: each counter
grows by what it grew per second in the run, each gauge keeps its last value, and each `*_timestamp_seconds`
gauge keeps its distance from now (a certificate's expiry stays as far ahead at the evaluation as at the scrape).
Every series gets the labels the chart's PodMonitor gives it (`namespace`, `job`, `pod`, `tier`). The alerts are
the module's PrometheusRules as it renders them (lab.deckhouse_module, as tests/chart does), evaluated at `SPAN`,
past every alert's range and `for`."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lab import deckhouse_module

STEP = 30          # seconds between scrapes (Deckhouse's Prometheus)
SPAN = 50 * 60     # seconds of series: past the longest range (15m) and `for` (30m) of the alerts
NAMESPACE = "d8-peering"


def alert_groups() -> list[dict]:
    """The rule groups of the module's PrometheusRules, rendered with the monitoring modules enabled."""
    values = deckhouse_module.module_values(
        {}, public_domain_template="%s.example.com", cluster_uuid="0b7c3e1a-5f2d-4c8e-9a61-2d4f8b3e7c10",
        https={"mode": "CertManager", "certManager": {"clusterIssuerName": "company-ca"}},
        enabled_modules=("user-authn", "cert-manager", "operator-prometheus", "operator-prometheus-crd"))
    groups = [g for o in deckhouse_module.render(values) if o["kind"] == "PrometheusRule" for g in o["spec"]["groups"]]
    assert groups, "the module rendered no PrometheusRule"
    return groups


def alerts(groups: list[dict]) -> list[dict]:
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


@dataclasses.dataclass(frozen=True)
class Scrape:
    """One /metrics of a process: when (wall clock), and each sample (name, labels) with its kind."""

    at: float
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float]]


async def scrape(http: aiohttp.ClientSession, ops_port: int) -> Scrape:
    async with http.get(f"http://127.0.0.1:{ops_port}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    at = time.time()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # the client's creation times: no Prometheus rule reads them
            if family.type in ("counter", "histogram", "summary") and not sample.name.endswith("_info"):
                kind = "counter"
            elif sample.name.endswith("_timestamp_seconds"):
                kind = "timestamp"
            else:
                kind = "gauge"
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = (kind, float(sample.value))
    return Scrape(at, samples)


def _series_name(name: str, labels: dict[str, str]) -> str:
    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return name + "{" + ",".join(f"{k}={quoted(v)}" for k, v in sorted(labels.items())) + "}"


def series(first: Scrape, last: Scrape, pod: str) -> list[dict]:
    """promtool input series for the run between `first` and `last` of the process `pod`, at the run's rates."""
    seconds = last.at - first.at
    assert seconds > 0
    steps = SPAN // STEP
    out = []
    for (name, labels), (kind, value) in sorted(last.samples.items()):
        target = {**dict(labels), "namespace": NAMESPACE, "job": "peering", "pod": pod, "tier": "cluster",
                  "instance": f"{pod}:https-metrics"}
        if kind == "counter":
            start = first.samples.get((name, labels), (kind, 0.0))[1]
            per_step = (value - start) / seconds * STEP
            assert per_step >= 0, f"{name}{labels} went down during the run"
            values = f"{start!r}+{per_step!r}x{steps}"
        elif kind == "timestamp":
            values = f"{value - last.at + SPAN!r}+0x{steps}"
        else:
            values = f"{value!r}+0x{steps}"
        out.append({"series": _series_name(name, target), "values": values})
    return out


def without_annotations(groups: list[dict]) -> list[dict]:
    """The groups with each alert's annotations left out (their text is not under test; expressions, `for` and
    labels are), so that an expected alert is named by its labels alone."""
    groups = copy.deepcopy(groups)
    for rule in alerts(groups):
        rule.pop("annotations", None)
    return groups


async def promtool_test(promtool: str, groups: list[dict], input_series: list[dict],
                        expected: dict[str, list[dict]], tmp_path, *, exprs_empty: list[str] = ()) -> tuple[int, str]:
    """`promtool test rules` of `groups` over `input_series` at SPAN: each alert of `expected` firing with exactly
    the label sets given (none: it does not fire), and each expression of `exprs_empty` without a sample; its
    exit code and output."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    test = {"interval": f"{STEP}s", "input_series": input_series,
            "alert_rule_test": [{"eval_time": f"{SPAN}s", "alertname": name,
                                 "exp_alerts": [{"exp_labels": labels} for labels in firing]}
                                for name, firing in expected.items()],
            "promql_expr_test": [{"expr": expr, "eval_time": f"{SPAN}s", "exp_samples": []} for expr in exprs_empty]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                        "tests": [test]}, sort_keys=False))
    proc = await asyncio.create_subprocess_exec(promtool, "test", "rules", "test.yaml", cwd=tmp_path,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    async with asyncio.timeout(120):
        output, _ = await proc.communicate()
    return proc.returncode, output.decode()
