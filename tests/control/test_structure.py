"""The shape of control/: no import circles, counting imports inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "control"


def _modules(package: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules(PACKAGE)


def _imports(module: str, path: pathlib.Path) -> set[str]:
    """Every module of the package that `module` imports anywhere in its text: at the top, inside functions, under
    `if TYPE_CHECKING:`. `from a.b import c` names the module a.b.c when there is one, else a.b."""
    tree = ast.parse(path.read_text(), str(path))
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _path(graph: dict[str, set[str]], component: list[str]) -> str:
    """One circle through the component, for the failure message."""
    start = component[0]
    members = set(component)
    trail, seen = [start], {start}
    while True:
        nxt = next((n for n in sorted(graph[trail[-1]]) if n in members and (n == start or n not in seen)), None)
        if nxt is None or nxt == start:
            return " -> ".join(trail + [start])
        trail.append(nxt)
        seen.add(nxt)


def test_the_walk_sees_lazy_and_type_only_imports():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    # control.cli imports control.process inside a function; the handlers import the Context type-only.
    assert "control.process" in graph["control.cli"]
    assert "control.context" in graph["control.handlers.join"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles_in_control():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    circles = [_path(graph, c) for c in _cycles(graph)]
    assert circles == [], "import circles in control/:\n" + "\n".join(circles)


def test_the_reconcilers_package_neither_patches_the_context_nor_imports_the_cli():
    text = (PACKAGE / "reconcilers" / "__init__.py").read_text()
    assert "setattr(" not in text
    assert "control.cli" not in _imports("control.reconcilers", PACKAGE / "reconcilers" / "__init__.py")
    assert "control.process" not in _imports("control.reconcilers", PACKAGE / "reconcilers" / "__init__.py")


def test_no_file_in_control_is_over_450_lines():
    long = {str(path.relative_to(ROOT)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 450}
    assert long == {}


def test_every_rule_module_is_used_by_product_code():
    """A rule module only tests import is a dead twin: "where is X decided" would find the wrong file."""
    products = {name for name in MODULES if not name.startswith("control.rules.")} | {"control.rules"}
    used = set()
    for name in products:
        used |= _imports(name, MODULES[name])
    # A rule module may be used through another rule module that product code uses.
    frontier = set(used)
    while frontier:
        name = frontier.pop()
        for dep in _imports(name, MODULES[name]) - used:
            used.add(dep)
            frontier.add(dep)
    rules = {name for name in MODULES if name.startswith("control.rules.")}
    assert sorted(rules - used) == []


def _classes(package: pathlib.Path) -> dict[str, str]:
    out = {}
    for path in package.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out[node.name] = str(path.relative_to(ROOT))
    return out


def test_no_class_of_control_has_the_name_of_one_of_the_gateway():
    ours, theirs = _classes(PACKAGE), _classes(ROOT / "gateway")
    assert {name: (ours[name], theirs[name]) for name in set(ours) & set(theirs)} == {}


def test_the_rules_import_only_rules_and_the_composition_root_only_the_cli():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    pure = {"control.pki", "control.peertrust", "control.connstring"}
    impure = {name: sorted(d for d in deps if not d.startswith("control.rules") and d not in pure)
              for name, deps in graph.items() if name.startswith("control.rules")}
    assert {name: deps for name, deps in impure.items() if deps} == {}
    assert [name for name, deps in graph.items() if "control.process" in deps] == ["control.cli"]


# Prefixes that once stood for a package in a flat tests/ directory; tests now live in packages mirroring the source.
_OLD_PREFIXES = ("rules", "runtime", "recon", "reconcilers", "handlers", "check", "gw", "gateway", "control")


def _prefixed(root: pathlib.Path, test_dirs: list[str], packages: set[str]) -> list[str]:
    """Test files named `test_<prefix>_...` where the prefix stands for a package instead of being one."""
    prefixes = set(_OLD_PREFIXES) | packages
    return sorted(str(path.relative_to(root)) for d in test_dirs for path in (root / d).rglob("test_*.py")
                  if len(path.stem.split("_")) > 2 and path.stem.split("_")[1] in prefixes)


def test_no_test_file_carries_a_package_prefix():
    """tests/control and tests/gateway mirror the source tree as packages: the tests of control/rules/grants.py are
    tests/control/rules/test_grants.py, never tests/control/test_rules_grants.py."""
    packages = {p.parent.name for root in (PACKAGE, ROOT / "gateway") for p in root.rglob("__init__.py")}
    found = _prefixed(ROOT, ["tests/control", "tests/gateway"], packages)
    assert found == [], ("test files named after a package instead of living in it (move them into "
                         "tests/<package>/<subpackage>/test_<module>.py): " + ", ".join(found))


def test_the_prefix_check_sees_a_prefixed_file(tmp_path):
    for name in ("test_rules_grants.py", "test_runtime_lease.py", "rules/test_grants.py", "test_check.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert _prefixed(tmp_path, ["."], {"rules"}) == ["test_rules_grants.py", "test_runtime_lease.py"]


def test_the_test_packages_mirror_the_source_packages():
    """Every package under tests/control is one of control/'s (tests/control/rules for control/rules, ...)."""
    tests = ROOT / "tests" / "control"
    strays = sorted(str(d.relative_to(ROOT)) for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__"
                    and not (PACKAGE / d.relative_to(tests)).is_dir())
    assert strays == [], f"test packages with no source package of that name under control/: {strays}"
    assert all((d / "__init__.py").exists() for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__")
