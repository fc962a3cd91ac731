"""dmt, Deckhouse's module linter, passes on charts/peering: with the values dmt generates from the module's own
schemas, and again with every optional module enabled so that the PrometheusRules, the dashboard and the VPA are
rendered and checked. The only ignored findings allowed are those .dmtlint.yaml configures, each with its
reason. dmt comes from tools/dmt.py: PEERING_DMT, else the binary cached outside the work tree (the Go module proxy
does not serve dmt; docs/module-build.md says how to build it from its source); without it the test is skipped
loudly, and fails instead when PEERING_REQUIRE_REAL_TOOLS=1."""

from __future__ import annotations

import os
import re
import sys

import pytest

from chart_paths import CHART_DIR, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
import dmt  # noqa: E402

# The findings .dmtlint.yaml turns off, by rule: the check that templates/monitoring.yaml includes helm_lib's
# helpers by name (the module renders the same objects with its own).
CONFIGURED = {"prometheus-rules": "The content of the 'templates/monitoring.yaml' should be equal to",
              "grafana-dashboards": "The content of the 'templates/monitoring.yaml' should be equal to"}


@pytest.fixture(scope="module")
def available() -> None:
    try:
        dmt.install()
    except dmt.DmtUnavailable as e:
        if os.environ.get("PEERING_REQUIRE_REAL_TOOLS") == "1":
            pytest.fail(f"PEERING_REQUIRE_REAL_TOOLS=1, so dmt must run: {e}", pytrace=False)
        pytest.skip(f"DMT LINT NOT RUN: {e}")


def findings(output: str) -> list[tuple[str, str]]:
    """(rule, message) of every finding dmt printed."""
    out = []
    for block in re.split(r"\n(?=\S*\s*\[)", output):
        rule = re.match(r"\S*\s*\[([\w-]+) \(#", block)
        message = re.search(r"Message:\s+(.*)", block)
        if rule and message:
            out.append((rule.group(1), message.group(1).strip()))
    return out


@pytest.mark.parametrize("extra", [[], ["--values-file", str(CHART_DIR.parent.parent / "tests" / "chart" /
                                                            "dmt-optional-modules.yaml")]],
                         ids=["dmt-values", "optional-modules"])
def test_dmt_lint_passes(available, extra: list[str]) -> None:
    proc = dmt.lint(["--show-ignored", *extra])
    output = proc.stdout + proc.stderr
    assert re.search(r"Modules:\s+1\b", output), output
    assert proc.returncode == 0, output
    found = findings(output)
    # The configured exceptions are printed as ignored: the parser sees findings, so an empty list means none.
    assert {rule for rule, _ in found} == set(CONFIGURED), output
    for rule, message in found:
        assert rule in CONFIGURED and message.startswith(CONFIGURED[rule]), (rule, message)
