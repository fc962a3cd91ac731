"""Composition by construction: the runtime makes each part with what it needs (no probing with getattr, nothing
set on the Context once it is made), and the ClusterPeer phases report through their outcomes (nothing but the
reconciler keeps the peer memory, and the memory a phase is given cannot be changed in place)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

from control.config import Settings
from control.context import Context
from control.handlers.dispatch import Handlers
from control.informers import Informers
from control.process import Runtime
from control.reconcilers.memory import PeerMemory
from gateway.exchange import ExchangeFailures
from tests.control.conftest import FakeClock
from tests.control.reconcilers.test_clusterpeer import Sink

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTROL = ROOT / "control"


def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_the_composition_root_neither_probes_nor_patches_what_it_made():
    tree = _tree(CONTROL / "process.py")
    probes = [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr",
                                                                                                  "hasattr")]
    assert probes == []
    # Nothing is set on the Context (or on anything reached through it) after it is made.
    patched = [node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Attribute) and "ctx" in ast.unparse(target.value)]
    assert patched == []


def test_the_composition_root_sets_no_attribute_of_anything_it_made():
    """Every component gets what it needs when it is made (the gateway its exchange record, which the runtime
    subscribes to), so nothing is wired by assignment afterwards: only a class's own `self` is assigned to."""
    tree = _tree(CONTROL / "process.py")
    wired = [f"{node.lineno}: {ast.unparse(target)}" for node in ast.walk(tree)
             if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(target, ast.Attribute) and ast.unparse(target.value) != "self"]
    assert wired == []


def test_no_reconciler_or_handler_sets_an_attribute_of_the_context():
    # (`ctx` elsewhere in control/ may be an SSLContext; in these packages and in `self.ctx` it is the Context.)
    for path in sorted([*(CONTROL / "reconcilers").rglob("*.py"), *(CONTROL / "handlers").rglob("*.py"),
                        *CONTROL.glob("*.py")]):
        names = ("ctx", "self.ctx") if path.parent != CONTROL or path.name == "process.py" else ("self.ctx",)
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and ast.unparse(target.value) in names:
                        pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} sets {ast.unparse(target)}")


def test_only_the_clusterpeer_reconciler_keeps_the_peer_memory():
    keepers = {path.relative_to(ROOT).as_posix() for path in sorted(CONTROL.rglob("*.py"))
               for node in ast.walk(_tree(path))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keep"
               and "memory" in ast.unparse(node.func.value)}
    assert keepers == {"control/reconcilers/clusterpeer/reconciler.py"}


def test_the_memory_a_phase_is_given_cannot_be_changed_in_place():
    mem = PeerMemory()
    with pytest.raises(dataclasses.FrozenInstanceError):
        mem.pull_at = 1.0  # type: ignore[misc]
    learnt = mem.learnt(pull_at=1.0, sync_error=("PeerUnreachable", "down"))
    assert (mem.pull_at, learnt.pull_at, learnt.sync_error) == (0.0, 1.0, ("PeerUnreachable", "down"))


async def test_the_runtime_hands_the_context_everything_when_it_is_made(kube):
    failures = ExchangeFailures()
    failures.record("peering-b", ("TokenExchangeMisconfigured", "the connector is wrong"))
    made: list[Context] = []

    def factory(ctx: Context):
        # What a reconciler factory sees is complete already: the controller, the exchange failures, the memory.
        made.append(ctx)
        assert ctx.controller is not None and ctx.exchange_failures() == failures.by_connector
        assert ctx.peer_memory is ctx.peer_memory

        class Nothing:
            name, watches = "nothing", ()

            async def reconcile(self, key):
                raise AssertionError("never run")
        return Nothing()

    runtime = Runtime(Settings(public_domain_template="%s.t.lab"), kube, Sink(), reconcilers=(factory,),
                      clock=FakeClock(), exchange_failures=failures)
    try:
        assert made == [runtime.ctx] and runtime.ctx.controller is runtime.controller
        assert [runner.reconciler.name for runner in runtime.controller.runners] == ["nothing"]
        assert runtime.metrics.memory is runtime.ctx.peer_memory
    finally:
        await runtime.ctx.close()
        await runtime.informers.stop()


async def test_the_context_closes_the_peer_client_it_made(kube):
    ctx = Context(Settings(public_domain_template="%s.t.lab"), kube, Informers(kube), Handlers())
    await ctx.close()  # nothing made yet: nothing to close
    client = ctx.peer_client
    assert ctx.peer_client is client
    await ctx.close()
    assert client._session is None and ctx.peer_client is not client
    await ctx.close()
