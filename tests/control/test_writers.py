"""Who writes what, as control/README.md says it: the peer Secret only through `control/peer_secret.py`, a
ClusterPeer's status only through `control/clusterpeer_status.py`, each called by the modules named here and no
other; the peer Secret's key names only in `contract/peer_secret.py`. Walked over the syntax trees, so a write
added anywhere else fails here."""

from __future__ import annotations

import ast
import pathlib

import pytest

from contract.peer_secret import KEYS

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("control", "gateway", "lab", "contract")

#: The writers of the peer Secret and the modules that may call each.
PEER_SECRET_WRITERS = {
    "write_peer_secret": {"control/reconcilers/clusterpeer/join.py"},
    "update_peer_secret": {"control/reconcilers/clusterpeer/sync.py", "control/handlers/peer.py"},
    "replace_peer_secret": {"control/handlers/join.py"},
    "drop_peer_secret": {"control/reconcilers/clusterpeer/reconciler.py"},
}
#: The writers of a ClusterPeer's status and the modules that may call each.
STATUS_WRITERS = {
    "write_status": {"control/reconcilers/clusterpeer/reconciler.py"},
    "write_invite": {"control/handlers/join.py"},
}
PEER_SECRET_MODULE = "control/peer_secret.py"
STATUS_MODULE = "control/clusterpeer_status.py"


def _modules(*packages: str) -> dict[str, ast.Module]:
    out = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[path.relative_to(ROOT).as_posix()] = ast.parse(path.read_text(), str(path))
    return out


MODULES = _modules(*PRODUCT)


def _name(node: ast.AST) -> str:
    """The called name: `f` of `f(...)` and of `x.f(...)`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _calls(tree: ast.Module):
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def _callers(name: str) -> set[str]:
    return {path for path, tree in MODULES.items() for call in _calls(tree) if _name(call.func) == name}


@pytest.mark.parametrize("writer", sorted(PEER_SECRET_WRITERS))
def test_each_writer_of_the_peer_secret_is_called_by_the_named_modules_only(writer):
    assert _callers(writer) - {PEER_SECRET_MODULE} == PEER_SECRET_WRITERS[writer]


@pytest.mark.parametrize("writer", sorted(STATUS_WRITERS))
def test_each_writer_of_a_clusterpeer_status_is_called_by_the_named_modules_only(writer):
    assert _callers(writer) - {STATUS_MODULE} == STATUS_WRITERS[writer]


def test_the_peer_secret_object_is_built_and_deleted_in_its_module_only():
    # The Secret object (`rules.credentials.peer_secret`) reaches the API only from control/peer_secret.py, and a
    # call naming the peer Secret (`peer_secret_name`) that writes is there too.
    assert _callers("peer_secret") == {PEER_SECRET_MODULE}
    writes = {"create", "update", "patch", "delete", "create_or_update", "replace"}
    naming = set()
    for path, tree in MODULES.items():
        for call in _calls(tree):
            if _name(call.func) in writes and any(isinstance(arg, ast.Call) and _name(arg.func) == "peer_secret_name"
                                                  for arg in ast.walk(call) if arg is not call):
                naming.add(path)
    assert naming <= {PEER_SECRET_MODULE}


def test_a_clusterpeer_status_is_written_in_its_module_only():
    writing = set()
    for path, tree in MODULES.items():
        for call in _calls(tree):
            if _name(call.func) == "update_status" and call.args and _name(call.args[0]) == "CLUSTERPEERS":
                writing.add(path)
    assert writing == {STATUS_MODULE}


def _strings(tree: ast.Module):
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return (node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings)


def test_the_peer_secret_keys_are_spelt_in_the_contract_only():
    spelt = {(path, node.value) for path, tree in MODULES.items() for node in _strings(tree) if node.value in KEYS}
    assert {path for path, _ in spelt} == {"contract/peer_secret.py"}, sorted(spelt)


def test_the_walk_sees_the_writes_it_holds():
    # The walk is not vacuous: the modules it names do write, through the calls it looks for.
    assert _callers("update_status") >= {STATUS_MODULE}
    assert _callers("create_or_update") >= {PEER_SECRET_MODULE}
    assert len(KEYS) == 6 and all(_callers(name) for name in (*PEER_SECRET_WRITERS, *STATUS_WRITERS))
