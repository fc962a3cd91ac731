"""The shape of the house, in one place: gateway/, control/, contract/, lab/ and bench/.

Everywhere: no import circle (every import counts, the lazy ones inside functions and the ones under
TYPE_CHECKING too), no file over 450 lines, no private member of another module used. In the product: the
contract imports neither package, every module of the gateway and every rule module is used by product code,
the gateway's request paths touch no other object's private members, the workers and the rules depend only on
what they compose, and the tests mirror the source packages and are named after behaviour."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRODUCT = ("contract", "gateway", "control")
PACKAGES = PRODUCT + ("lab", "bench")
# Held to "no private member of another module": every package.
PRIVATE_CHECKED = PACKAGES
MAX_LINES = 450


def _modules(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules(ROOT, PACKAGES)


def _package_of(name: str, path: pathlib.Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def _ours(target: str, modules: dict[str, pathlib.Path]) -> str:
    """The module of ours that an import of `target` loads (`a.b.c` may name a function of module a.b), or ""."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def imports_of(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path] = MODULES) -> set[str]:
    """Every module of ours that `name` imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(), str(path))
    package = _package_of(name, path)
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            # `from control.rules import offer` imports control.rules.offer; `import a.b.c` imports a.b.c.
            target = _ours(target, modules)
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


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
        for nxt in sorted(graph.get(node, ())):
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


def _private_uses(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path] = MODULES) -> list[str]:
    """Where `name` uses a private (`_x`, not dunder) member of another module of ours: `from m import _x`, or
    `m._x` on a name bound to module m by an import."""
    tree = ast.parse(path.read_text(), str(path))
    package = _package_of(name, path)
    bound: dict[str, str] = {}
    found: list[str] = []

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    bound[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
                elif base in modules and base != name and private(a.name):
                    found.append(f"line {node.lineno}: from {base} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            # `lab.real.runner._x`: the dotted chain of names, read as a module path.
            chain = []
            while isinstance(owner, ast.Attribute):
                chain.append(owner.attr)
                owner = owner.value
            if isinstance(owner, ast.Name) and owner.id in bound:
                module = ".".join([bound[owner.id], *reversed(chain)])
                if module in modules and module != name:
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


# --- the walkers see what they must -------------------------------------------------------------------------------

def test_the_walker_sees_lazy_type_only_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for stem in ("__init__", "a", "b", "c", "d"):
        (pkg / f"{stem}.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
                              "def f():\n    import pkg.c\n    from . import d as dd\n")
    modules = _modules(tmp_path, ("pkg",))
    assert imports_of("pkg.a", pkg / "a.py", modules) == {"pkg.b", "pkg.c", "pkg.d"}
    # The real tree: control.cli imports control.process inside a function; the handlers import the Context
    # type-only.
    assert "control.process" in GRAPH["control.cli"]
    assert "control.context" in GRAPH["control.handlers.join"]


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _path(graph, ["a", "b", "c"]) == "a -> b -> c -> a"


def test_the_private_member_check_sees_both_forms(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text("_x = 1\n")
    (pkg / "n.py").write_text("from pkg.m import _x\nfrom pkg import m\nimport pkg.m as mm\nimport pkg.m\n"
                              "print(m._x, mm._y, pkg.m._z, m.__name__, m.public)\n")
    modules = _modules(tmp_path, ("pkg",))
    assert _private_uses("pkg.n", pkg / "n.py", modules) == [
        "line 1: from pkg.m import _x", "line 5: m._x", "line 5: mm._y", "line 5: pkg.m._z"]


# --- everywhere ---------------------------------------------------------------------------------------------------

def test_no_import_circles():
    circles = [_path(GRAPH, c) for c in _cycles(GRAPH)]
    assert circles == [], "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_file_is_over_450_lines(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines; split it by what it does"


def test_no_module_uses_a_private_member_of_another():
    found = {name: uses for name, path in MODULES.items()
             if name.split(".")[0] in PRIVATE_CHECKED and (uses := _private_uses(name, path))}
    assert found == {}, "private members used across modules (make them public or move the code): " + repr(found)


# --- the product --------------------------------------------------------------------------------------------------

def test_the_contract_imports_neither_package():
    for name, deps in GRAPH.items():
        if name.startswith("contract"):
            assert not {d for d in deps if not d.startswith("contract")}, (name, deps)


def test_every_rule_module_is_used_by_product_code():
    """A rule module only tests import is a dead twin: "where is X decided" would find the wrong file. Used
    directly by a module of the product, or through another rule module that control/ uses."""
    rules = {n for n in MODULES if n.startswith("control.rules.")}
    product = {n for n in MODULES if n.split(".")[0] in PRODUCT and n not in rules}
    direct = set().union(*(GRAPH[n] for n in product))
    assert sorted(r for r in rules if r not in direct and not any(r in GRAPH[u] for u in rules & direct)) == []
    used = set().union(*(GRAPH[n] for n in product if n.startswith("control")))
    frontier = set(used)
    while frontier:
        for dep in GRAPH[frontier.pop()] - used:
            used.add(dep)
            frontier.add(dep)
    assert sorted(rules - used) == []


def test_every_gateway_module_is_used():
    gateway = {n for n in MODULES if n.startswith("gateway.")}
    users = {n for n in MODULES if n.split(".")[0] in ("gateway", "control", "lab")}
    used = set().union(*(GRAPH[n] for n in users))
    assert sorted(gateway - used) == [], "modules nothing imports"


def test_workers_compose_the_data_plane_and_never_the_process_gateway():
    assert "gateway.server" not in GRAPH["gateway.workers"] | GRAPH["gateway.worker"]
    assert "gateway.dataplane" in GRAPH["gateway.worker"]
    # The protocols and handlers get the state object, never the Gateway.
    for module in ("gateway.engine", "gateway.relay", "gateway.listeners", "gateway.join", "gateway.admission",
                   "gateway.dataplane", "gateway.state"):
        assert "gateway.server" not in GRAPH[module], module


#: The methods of a namedtuple, public though their names begin with an underscore.
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_make", "_fields"})
GATEWAY = sorted(n for n in MODULES if n.startswith("gateway."))


@pytest.mark.parametrize("name", GATEWAY)
def test_no_gateway_module_touches_a_private_member_of_another_object(name):
    """Every module, the TLS acceptor and its streams included: they talk through public calls only."""
    offending = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and node.attr not in NAMEDTUPLE_API:
            owner = node.value
            own = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            base = isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
            if not (own or base):
                offending.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert offending == []


#: What configuring an ssl.SSLContext or a ctypes function prototype means: the objects tls.py makes itself.
CONFIGURATION = frozenset({"minimum_version", "maximum_version", "options", "num_tickets", "sslobject_class",
                           "verify_mode", "verify_flags", "restype", "argtypes"})


@pytest.mark.parametrize("name", ["gateway.tls", "gateway.tlsstream", "gateway.tcp", "gateway.connections",
                                  "gateway.engine", "gateway.listeners", "gateway.relay", "gateway.http",
                                  "gateway.dataplane"])
def test_the_connection_layers_set_no_attribute_on_another_object(name):
    """A connection's layers (TLS acceptor, stream, protocol, the tracking of connections by peer) keep what they
    know of each other themselves and pass the rest in calls: none sets an attribute on an object it was given."""
    offending = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(element, ast.Attribute) and element.attr not in CONFIGURATION:
                    owner = element.value
                    if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                        offending.append(f"line {element.lineno}: {ast.unparse(element)}")
    assert offending == []


@pytest.mark.parametrize("name", ["gateway.tls", "gateway.tlsstream", "gateway.tcp", "gateway.connections",
                                  "gateway.engine", "gateway.serving", "gateway.answering", "gateway.listeners",
                                  "gateway.relay", "gateway.upload"])
def test_each_connection_layer_writes_only_to_its_own_transport(name):
    """The relay hands an answer's bytes to the connection that owns the exchange, which writes them to its client:
    no layer reaches for another object's transport."""
    offending = [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(MODULES[name].read_text()))
                 if isinstance(node, ast.Attribute) and node.attr == "transport"
                 and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    assert offending == []


#: What an I/O-free connection may not touch: the modules of I/O, and the names of a transport's and a loop's doing.
_IO_MODULES = frozenset({"asyncio", "socket", "ssl", "selectors", "aiohttp", "uvloop"})
_IO_NAMES = frozenset({"transport", "loop", "create_task", "ensure_future", "call_soon", "call_later", "call_at",
                       "get_running_loop", "sleep"})


@pytest.mark.parametrize("name", ["gateway.serving", "gateway.answering", "gateway.calls", "gateway.upload"])
def test_the_connections_behaviour_does_no_io(name):
    """The connection of the entrance and the egress (serving.Serving, with its peer calls and bodies) is
    sans-I/O: it gives commands to its `io`, its relay and its pool, and engine.Connection carries out the client's
    side on asyncio; none of its modules imports I/O or reaches for a transport or a loop."""
    offending = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            offending += [f"line {node.lineno}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] in _IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _IO_MODULES:
            offending.append(f"line {node.lineno}: from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr in _IO_NAMES:
            offending.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert offending == []


def _aiohttp_importers() -> set[str]:
    found = set()
    for name in GATEWAY:
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "aiohttp" for a in node.names)) or (
                    isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiohttp"):
                found.add(name)
    return found


#: Where aiohttp is the tool in gateway/: the listeners it serves (the join and ops: http.py, join.py,
#: dataplane.py; the parent's socket for its workers, workers.py) and the HTTP clients of Dex, the TokenReview and
#: a worker's parent (exchange.py, tokenreview.py, worker.py, with their sessions, state.py, and name overrides,
#: resolve.py). The entrance and the egress, every byte a peer or a consumer sends, are none of them.
AIOHTTP_ALLOWED = {"gateway.http", "gateway.join", "gateway.dataplane", "gateway.workers",
                   "gateway.exchange", "gateway.tokenreview", "gateway.worker", "gateway.state", "gateway.resolve"}
#: The modules that serve with aiohttp's server (web, web_protocol, web_server): the join and ops listeners only
#: (http.py, join.py, and dataplane.py, which composes them and answers the ops listener), and the parent's Unix
#: socket for its own workers (workers.py), which is no listener of the gateway.
AIOHTTP_SERVERS = {"gateway.http", "gateway.join", "gateway.dataplane", "gateway.workers"}
AIOHTTP_SERVER_PARTS = frozenset({"web", "web_protocol", "web_server", "web_request", "web_response"})


def _aiohttp_server_importers() -> set[str]:
    found = set()
    for name in GATEWAY:
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            if isinstance(node, ast.Import) and any(
                    a.name.split(".")[0] == "aiohttp" and a.name.split(".")[1:2] and
                    a.name.split(".")[1] in AIOHTTP_SERVER_PARTS for a in node.names):
                found.add(name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiohttp":
                parts = (node.module or "").split(".")[1:2] or [a.name for a in node.names]
                if set(parts) & AIOHTTP_SERVER_PARTS:
                    found.add(name)
    return found


#: What serves the entrance and the egress: the engine and everything it is made of.
ENGINE = {"gateway.engine", "gateway.listeners", "gateway.calls", "gateway.upload", "gateway.heads",
          "gateway.framing", "gateway.relay", "gateway.upstream", "gateway.tls", "gateway.tlsstream", "gateway.tcp",
          "gateway.connections", "gateway.admission", "gateway.catchup", "gateway.status"}


def test_the_entrance_and_the_egress_import_no_aiohttp_anywhere():
    assert _aiohttp_importers() <= AIOHTTP_ALLOWED
    assert not ENGINE & _aiohttp_importers()


def test_only_the_join_and_ops_listeners_are_served_by_aiohttp():
    """The egress is the engine's too: aiohttp's server is imported only where the join and ops listeners are
    made; its client sessions (Dex, TokenReview, a worker's parent) are not a server."""
    assert _aiohttp_server_importers() == AIOHTTP_SERVERS
    # The engine's protocol serves both TLS listeners, each with its own listener object.
    dataplane = MODULES["gateway.dataplane"].read_text()
    assert dataplane.count("Connection(state, self.handlers, ") == 2


def test_the_reconcilers_package_neither_patches_the_context_nor_imports_the_cli():
    assert "setattr(" not in MODULES["control.reconcilers"].read_text()
    assert not {"control.cli", "control.process"} & GRAPH["control.reconcilers"]


def test_the_rules_import_only_rules_and_the_composition_root_only_the_cli():
    pure = {"control.pki", "control.peertrust", "control.connstring"}
    impure = {name: sorted(d for d in deps if d.startswith("control")
                           and not d.startswith("control.rules") and d not in pure)
              for name, deps in GRAPH.items() if name.startswith("control.rules")}
    assert {name: deps for name, deps in impure.items() if deps} == {}
    assert [name for name, deps in GRAPH.items()
            if name.startswith("control.") and "control.process" in deps] == ["control.cli"]


def _classes(package: pathlib.Path) -> dict[str, str]:
    out = {}
    for path in package.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out[node.name] = str(path.relative_to(ROOT))
    return out


def test_no_class_of_control_has_the_name_of_one_of_the_gateway():
    ours, theirs = _classes(ROOT / "control"), _classes(ROOT / "gateway")
    assert {name: (ours[name], theirs[name]) for name in set(ours) & set(theirs)} == {}


def test_every_test_the_threat_table_names_exists():
    readme = (ROOT / "gateway" / "README.md").read_text()
    table = readme[readme.index("## Threats and the tests that cover them"):]
    named = set()
    for line in table.splitlines():
        if line.startswith("|"):
            for ref in line.rsplit("|", 2)[-2].split(","):
                ref = ref.strip()
                if "::" in ref:
                    named.add(ref)
    assert len(named) > 20
    missing = []
    for ref in sorted(named):
        module, test = ref.split("::")
        path = ROOT / "tests" / "gateway" / f"{module}.py"
        if not path.exists() or f"def {test}(" not in path.read_text():
            missing.append(ref)
    assert missing == []


# --- the tests ----------------------------------------------------------------------------------------------------

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
    packages = {p.parent.name for root in (ROOT / "control", ROOT / "gateway") for p in root.rglob("__init__.py")}
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
                    and not (ROOT / "control" / d.relative_to(tests)).is_dir())
    assert strays == [], f"test packages with no source package of that name under control/: {strays}"
    assert all((d / "__init__.py").exists() for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__")


_ISSUE = re.compile(r"(?i)\bissue[ _-]?\d+|(?:^|_)(?:issue|gh|bug)_?\d+(?:_|$)")


def test_tests_are_named_after_behaviour_not_issue_numbers():
    named = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if _ISSUE.search(path.stem):
            named.append(str(path.relative_to(ROOT)))
        tree = ast.parse(path.read_text(), str(path))
        doc = ast.get_docstring(tree) or ""
        if _ISSUE.search(doc):
            named.append(f"{path.relative_to(ROOT)}: its docstring")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _ISSUE.search(node.name):
                named.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert named == [], "name the behaviour, not the issue: " + ", ".join(named)


def test_the_issue_check_sees_an_issue_number():
    assert _ISSUE.search("test_issue_13_holds") and _ISSUE.search("A head has a deadline (issue 14.6)")
    assert not _ISSUE.search("test_oversized_header_gives_431") and not _ISSUE.search("issued tokens")
