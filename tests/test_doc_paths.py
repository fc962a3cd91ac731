"""Every path of the tree that README.md, docs/ and bench/RESULTS.md name exists: a file, a folder, or a glob that
matches at least one of them (a doc that names a test file that was renamed or removed is wrong)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOP = ("contract", "gateway", "control", "lab", "charts", "tests", "bench", "docs", "fuzz", "tools")
#: What the tools write (ignored by git): a document may name where an output goes.
OUTPUTS = ("bench/out/", "build/")
# A path: one of the tree's top folders, then name characters, slashes and globs; a trailing dot or comma ends it.
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w.*/\-]*[\w*/])")


def named_paths(text: str) -> set[str]:
    found = set()
    for m in PATH.finditer(text):
        found.add(m.group(1).rstrip("/"))
    return found


def exists(path: str) -> bool:
    if path.startswith(OUTPUTS):
        return True
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_document_names_exists(doc):
    missing = sorted(p for p in named_paths(doc.read_text()) if not exists(p))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that are not in the tree: {missing}"


def test_the_finder_sees_paths_in_prose_code_and_tables():
    text = "see `tests/gateway/test_gw_*.py`, gateway/tls.py. | bench/RESULTS.md | (lab/README.md) x/gateway/no"
    assert named_paths(text) == {"tests/gateway/test_gw_*.py", "gateway/tls.py", "bench/RESULTS.md", "lab/README.md"}
