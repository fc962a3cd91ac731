"""The shape of gateway/: no import circles (lazy and type-only imports count), no file over 450 lines, no module
that nothing uses, no module reaching into another object's private members, and no connection layer setting
attributes on another's objects."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
MODULES = {f"gateway.{p.stem}": p for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}


def imports_of(path: pathlib.Path) -> set[str]:
    """Every gateway module `path` imports anywhere: at the top, inside functions, under TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gateway."))
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module == "gateway":
                found.update(f"gateway.{a.name}" for a in node.names)
            elif node.module.startswith("gateway."):
                found.add(node.module)
    return found & set(MODULES)


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def test_the_walker_sees_lazy_and_type_only_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.server import Gateway\n"
                      "def f():\n    import gateway.workers\n    from gateway import worker as w\n")
    assert imports_of(sample) == {"gateway.server", "gateway.workers", "gateway.worker"}


def test_no_import_circles_in_the_gateway():
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_workers_compose_the_data_plane_and_never_the_process_gateway():
    assert "gateway.server" not in GRAPH["gateway.workers"] | GRAPH["gateway.worker"]
    assert "gateway.dataplane" in GRAPH["gateway.worker"]
    # The protocols and handlers get the state object, never the Gateway.
    for module in ("gateway.entrance", "gateway.relay", "gateway.listeners", "gateway.proxy", "gateway.admission",
                   "gateway.dataplane", "gateway.state"):
        assert "gateway.server" not in GRAPH[module], module


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_gateway_file_is_over_450_lines(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= 450, f"{MODULES[name].relative_to(ROOT)} has {lines} lines; split it by job"


def test_every_gateway_module_is_used_by_product_code():
    used = set().union(*GRAPH.values())
    outside = set()
    for path in [*ROOT.glob("control/**/*.py"), *ROOT.glob("lab/**/*.py")]:
        outside |= imports_of(path)
    unused = sorted(set(MODULES) - used - outside)
    assert unused == [], f"modules nothing imports: {unused}"


#: The methods of a namedtuple, public though their names begin with an underscore.
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_make", "_fields"})


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_touches_a_private_member_of_another_object(name):
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
                                  "gateway.entrance", "gateway.relay", "gateway.http", "gateway.dataplane"])
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


def test_every_test_the_threat_table_names_exists():
    readme = (PACKAGE / "README.md").read_text()
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


def aiohttp_importers() -> set[str]:
    found = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "aiohttp" for a in node.names)) or (
                    isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aiohttp"):
                found.add(name)
    return found


#: Where aiohttp is the tool: the listeners it serves (the egress, the join and ops: http.py, listeners.py,
#: proxy.py, dataplane.py; the parent's socket for its workers, workers.py) and the HTTP clients of Dex, the
#: TokenReview and a worker's parent (exchange.py, tokenreview.py, worker.py, with their sessions, state.py, and
#: name overrides, resolve.py). The entrance, every byte a peer sends, is none of them.
AIOHTTP_ALLOWED = {"gateway.http", "gateway.listeners", "gateway.proxy", "gateway.dataplane", "gateway.workers",
                   "gateway.exchange", "gateway.tokenreview", "gateway.worker", "gateway.state", "gateway.resolve"}


def test_the_entrance_imports_no_aiohttp_anywhere():
    assert aiohttp_importers() <= AIOHTTP_ALLOWED
    entrance = {"gateway.entrance", "gateway.calls", "gateway.upload", "gateway.heads", "gateway.framing",
                "gateway.relay", "gateway.tls", "gateway.tlsstream", "gateway.tcp", "gateway.connections",
                "gateway.admission", "gateway.catchup", "gateway.status"}
    assert not entrance & aiohttp_importers()
