"""lab/testing.py `RealApiserverAlone`: one real kube-apiserver shared by a module's tests, brought back between
them to what it held when told so (`baseline()`), as a new emulator would be."""

from __future__ import annotations

import pytest

from lab.cluster import MODULE_CRDS
from lab.testing import RealApiserverAlone

pytestmark = pytest.mark.timeout(180)

GROUP = "peering.deckhouse.io"


@pytest.fixture(scope="module")
def real(binaries, tmp_path_factory):
    alone = RealApiserverAlone(tmp_path_factory.mktemp("alone"), crd_paths=[MODULE_CRDS])
    with alone.started():
        alone.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kept"}})
        alone.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seed", "namespace": "kept"}})
        alone.baseline()
        yield alone


async def test_a_reset_deletes_what_was_made_since_the_baseline_and_keeps_the_rest(real):
    kept = real.get("", "configmaps", "seed", "kept")
    real.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "made"}})
    real.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "inside", "namespace": "made"}})
    real.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "beside", "namespace": "kept"}})
    # A finalizer nothing would ever remove: the reset takes it off.
    real.create({"apiVersion": f"{GROUP}/v1alpha1", "kind": "ClusterPeer",
                 "metadata": {"name": "held", "finalizers": ["example.com/never"]}, "spec": {"type": "Invite"}})
    real.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "made"},
                 "rules": []})
    await real.reset()
    assert real.get("", "namespaces", "made") is None
    assert real.get("", "configmaps", "beside", "kept") is None
    assert real.get(GROUP, "clusterpeers", "held") is None
    assert real.get("rbac.authorization.k8s.io", "clusterroles", "made") is None
    assert real.get("", "configmaps", "seed", "kept")["metadata"]["uid"] == kept["metadata"]["uid"]
    # Nothing made: nothing to do.
    await real.reset()
    assert real.get("", "namespaces", "kept") is not None
