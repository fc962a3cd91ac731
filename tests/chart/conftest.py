"""Shared fixtures of the chart tests: the CRDs as parsed objects and the two contract documents as text."""

from __future__ import annotations

import pytest
import yaml

from chart_paths import CRD_DIR, GUIDE, REFERENCE


def load_crds() -> dict[str, dict]:
    """The CRDs of the chart by kind, read from charts/peering/crds/."""
    crds: dict[str, dict] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        if path.name.startswith("doc-ru-"):
            continue  # the Russian descriptions for the documentation, not CRDs
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                crds[doc["spec"]["names"]["kind"]] = doc
    return crds


@pytest.fixture(scope="session")
def crds() -> dict[str, dict]:
    return load_crds()


@pytest.fixture(scope="session")
def reference_text() -> str:
    return REFERENCE.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def guide_text() -> str:
    return GUIDE.read_text(encoding="utf-8")
