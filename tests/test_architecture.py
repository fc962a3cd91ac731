"""The shape of the house (issue 13): no import circles in gateway/, control/ or contract/ (every import counts,
the lazy ones inside functions and the ones under TYPE_CHECKING too), no file there over 450 lines, the contract
imports neither package, and every rule module is used by product code."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "gateway", "control")
MAX_LINES = 450


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """Every module of ours that `name` imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            # `from control.rules import offer` imports control.rules.offer; `import a.b.c` imports a.b.c.
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circles():
    cycle = _cycle()
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_contract_imports_neither_package():
    for name, deps in GRAPH.items():
        if name.startswith("contract"):
            assert not {d for d in deps if not d.startswith("contract")}, (name, deps)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_file_is_over_450_lines(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines; split it by what it does"


def test_every_rule_module_is_used_by_product_code():
    rules = [n for n in MODULES if n.startswith("control.rules.")]
    users = {n: deps for n, deps in GRAPH.items() if not n.startswith("control.rules.")}
    unused = [r for r in rules if not any(r in deps for deps in users.values())]
    assert unused == []
