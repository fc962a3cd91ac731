"""Shared fixtures of the chart tests: where the chart, the CRDs and the contract documents are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "peering"
CRD_DIR = CHART_DIR / "crds"
# The contract documents live beside the repository (CI keeps them there too), not in it: the tests read the
# documents themselves so that the CRDs are compared with what administrators are told, not with a copy.
SPEC_DIR = REPO_ROOT.parent / "shared" / "spec"
REFERENCE = SPEC_DIR / "000_09d32f1c8e90d8df.txt"
GUIDE = SPEC_DIR / "001_607f3d4900661884.txt"


def load_crds() -> dict[str, dict]:
    """The CRDs of the chart by kind, read from charts/peering/crds/."""
    crds: dict[str, dict] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
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
