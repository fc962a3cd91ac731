"""Where the chart, its CRDs and the contract documents are, for every chart test (a module of its own name, so
that no other folder's conftest can shadow it)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "peering"
CRD_DIR = CHART_DIR / "crds"
# The contract documents: the originals beside the repository when they are there (CI keeps them there), else the
# copies in docs/spec/ so that a clone on its own still runs every test; test_chart_spec_copy keeps the two equal.
ORIGINAL_SPEC_DIR = REPO_ROOT.parent / "shared" / "spec"
COPY_SPEC_DIR = REPO_ROOT / "docs" / "spec"
SPEC_DIR = ORIGINAL_SPEC_DIR if ORIGINAL_SPEC_DIR.is_dir() else COPY_SPEC_DIR
REFERENCE = SPEC_DIR / "000_09d32f1c8e90d8df.txt"
GUIDE = SPEC_DIR / "001_607f3d4900661884.txt"
