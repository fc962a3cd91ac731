"""Where the chart, its CRDs and the contract documents are, for every chart test (a module of its own name, so
that no other folder's conftest can shadow it)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "peering"
CRD_DIR = CHART_DIR / "crds"
# The contract documents live beside the repository (CI keeps them there too), not in it: the tests read the
# documents themselves so that the CRDs are compared with what administrators are told, not with a copy.
SPEC_DIR = REPO_ROOT.parent / "shared" / "spec"
REFERENCE = SPEC_DIR / "000_09d32f1c8e90d8df.txt"
GUIDE = SPEC_DIR / "001_607f3d4900661884.txt"
