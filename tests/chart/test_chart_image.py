"""images/peering/: what can be checked without building it here. Every file the Dockerfile copies exists in the
build context (the repository root), the final stage is a distroless base, it runs as Deckhouse's unprivileged
user, its entrypoint is `peering run`, and every package of this repository that the process imports is copied."""

from __future__ import annotations

import ast
import re

from chart_paths import CHART_DIR, REPO_ROOT

DOCKERFILE = CHART_DIR / "images" / "peering" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [tuple(line.split(None, 1)) for line in text.splitlines()
            if line.strip() and not line.startswith("#") and len(line.split(None, 1)) == 2]


def test_every_copied_file_exists_in_the_build_context() -> None:
    copies = [args.split() for op, args in instructions() if op == "COPY" and "--from=" not in args]
    assert copies
    for parts in copies:
        for source in parts[:-1]:
            assert (REPO_ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"


def test_the_final_stage_is_distroless_non_root_with_the_entrypoint_peering_run() -> None:
    ops = instructions()
    froms = [args for op, args in ops if op == "FROM"]
    assert froms[-1].startswith("$BASE_DISTROLESS")
    assert all(f.split()[0].startswith("$BASE_") for f in froms)
    final = ops[max(i for i, (op, _) in enumerate(ops) if op == "FROM"):]
    user = [args for op, args in final if op == "USER"]
    assert user == ["64535:64535"]
    entry = [args for op, args in final if op == "ENTRYPOINT"]
    cmd = [args for op, args in final if op == "CMD"]
    assert entry == ['["/usr/local/bin/peering"]'] and cmd == ['["run"]']
    script = CHART_DIR / "images" / "peering" / "rootfs" / "usr" / "local" / "bin" / "peering"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/python3\n") and "from control.cli import main" in text
    assert script.stat().st_mode & 0o111


def test_every_repository_package_the_process_imports_is_copied() -> None:
    copied = {args.split()[0].rstrip("/") for op, args in instructions() if op == "COPY" and "--from=" not in args}
    local = {p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").is_file()}
    imported: set[str] = set()
    for package in ("control", "gateway"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported.add(node.module.split(".")[0])
    needed = (imported & local) - {"lab", "tests", "bench"}
    assert needed <= copied, f"the process imports {sorted(needed - copied)}, which the image does not copy"
