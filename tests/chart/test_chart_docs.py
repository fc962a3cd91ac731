"""The module's documentation (charts/peering/docs/) as Deckhouse's site builds it: the site adds the lifecycle stage
and the requirements from module.yaml and the schemas where `<!-- SCHEMA -->` stands, so the pages say none of that
themselves and render each schema once. And the pages tell an administrator what the module needs of them: how to
get it (ModuleSource, ModuleUpdatePolicy, ModulePullOverride) at the Deckhouse release module.yaml asks for, which
setting lets a host-network ingress controller join, and what a restore of the configuration backup brings back."""

from __future__ import annotations

import re

import pytest
import yaml

from chart_paths import CHART_DIR

DOCS = CHART_DIR / "docs"
PAGES = sorted(DOCS.glob("*.md"))
# What the site writes from module.yaml (stage, requirements) on its own, in both languages.
SITE_TEXT = ("The module lifecycle stage", "The module has requirements", "Стадия жизненного цикла модуля",
             "У модуля есть требования")


def test_there_are_pages_in_both_languages() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "CONFIGURATION.md", "CR.md", "FAQ.md"} <= names
    assert {n.replace(".md", ".ru.md") for n in names if not n.endswith(".ru.md")} <= names


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_page_carries_the_sites_own_text(page) -> None:
    text = page.read_text()
    assert not re.search(r"\{\{|\{%", text), f"{page.name} carries site templating; the site renders the schemas"
    for line in SITE_TEXT:
        assert line not in text, f"{page.name} says {line!r}, which the site writes from module.yaml"


@pytest.mark.parametrize("name", ["CONFIGURATION.md", "CONFIGURATION.ru.md", "CR.md", "CR.ru.md"])
def test_each_schema_page_renders_its_schema_once(name: str) -> None:
    assert (DOCS / name).read_text().count("<!-- SCHEMA -->") == 1


@pytest.mark.parametrize("name", ["README.md", "README.ru.md"])
def test_the_readme_says_how_to_get_the_module_at_the_release_it_needs(name: str) -> None:
    text = (DOCS / name).read_text()
    for kind in ("ModuleSource", "ModuleUpdatePolicy", "ModulePullOverride"):
        assert f"kind: {kind}" in text, kind
    floor = yaml.safe_load((CHART_DIR / "module.yaml").read_text())["requirements"]["deckhouse"].removeprefix(">= ")
    assert f"Deckhouse {floor}" in text


@pytest.mark.parametrize("name", ["FAQ.md", "FAQ.ru.md"])
def test_the_faq_tells_host_network_joins_and_restores(name: str) -> None:
    text = (DOCS / name).read_text()
    settings = yaml.safe_load((CHART_DIR / "openapi" / "config-values.yaml").read_text())["properties"]
    assert "joinNodeNetworks" in text and "joinNodeNetworks" in settings
    for inlet in ("HostWithFailover", "HostPort", "LoadBalancer"):
        assert inlet in text
    assert "backup.deckhouse.io/cluster-config" in text and "TokenUsed" in text and "<omitted>" in text
