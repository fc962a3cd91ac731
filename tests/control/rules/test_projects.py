"""Paired projects: which projects pair, the ProjectPeer per pair, its status, and removal of lost pairs."""

from __future__ import annotations

import copy

from control.rules import projects as pr
from control.rules.effective import EffectiveCapability
from control.rules.grants import diff_objects

CP = {"metadata": {"name": "cluster-a", "uid": "u1"}, "status": {"peer": {"alias": "cluster-b"}}}


def ns(name, project=None):
    labels = {pr.PROJECT_LABEL: project} if project else {}
    return {"metadata": {"name": name, "labels": labels}}


NAMESPACES = [
    ns("alpha", "alpha"),
    ns("alpha-db", "alpha"),
    ns("beta"),  # main namespace without the label still belongs to its project
    ns("beta-x", "beta"),
    ns("stray", "gamma"),  # no Project gamma: ignored
    ns("delta-only", "delta"),  # Project delta has no main namespace
    {"metadata": {}},
]
def project(name, namespaces=None, version="v1alpha3"):
    obj = {"apiVersion": f"deckhouse.io/{version}", "kind": "Project", "metadata": {"name": name}}
    if namespaces is not None:
        obj["status"] = {"namespaces": namespaces}
    return obj


LOCAL = pr.local_projects([project("alpha"), project("beta"), project("delta")], NAMESPACES)
PEER = [
    {"name": "alpha", "namespaces": ["alpha", "alpha-cache"]},
    {"name": "beta", "namespaces": ["beta"]},
    {"name": "delta", "namespaces": ["delta"]},
    {"name": "omega", "namespaces": ["omega"]},
    "garbage",
]
EFF = [
    EffectiveCapability("storage", "v1", ("project",)),
    EffectiveCapability("dns", "v1", ("cluster",)),
    EffectiveCapability("mixed", "v2", ("cluster", "project")),
]


def test_local_projects():
    assert LOCAL == {"alpha": ["alpha", "alpha-db"], "beta": ["beta", "beta-x"], "delta": ["delta-only"]}


def test_both_served_shapes_of_status_namespaces_count():
    """v1alpha3 lists {name, kind: Main|Additional}; v1alpha2 lists names. A ProjectNamespace-made namespace that
    is listed there pairs even before it carries the label; one listed but gone does not."""
    namespaces = [ns("alpha"), ns("alpha-extra"), ns("beta"), ns("beta-extra")]
    v3 = project("alpha", [{"name": "alpha", "kind": "Main"}, {"name": "alpha-extra", "kind": "Additional"},
                           {"name": "alpha-gone", "kind": "Additional"}])
    v2 = project("beta", ["beta", "beta-extra", 7, None], version="v1alpha2")
    assert pr.local_projects([v3, v2], namespaces) == {"alpha": ["alpha", "alpha-extra"],
                                                       "beta": ["beta", "beta-extra"]}
    assert pr.local_projects([project("gamma", "not a list"), {"metadata": {}}, "junk"], []) == {"gamma": []}


def test_pairs_need_both_sides_and_a_main_namespace():
    pairs = pr.pair_projects(LOCAL, PEER)
    assert [p.project for p in pairs] == ["alpha", "beta"]
    assert pairs[0].local_namespaces == ("alpha", "alpha-db")
    assert pairs[0].remote_namespaces == ("alpha", "alpha-cache")
    assert pr.paired_namespaces(pairs) == ["alpha", "alpha-db", "beta", "beta-x"]
    assert pr.pairs_count(pairs) == 2
    assert pr.pair_projects(LOCAL, None) == []


def test_project_peer_objects():
    pairs = pr.pair_projects(LOCAL, PEER)
    objs = pr.desired_project_peers(CP, "b-uuid", pairs, EFF, reachable=True)
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs] == [
        ("alpha", "cluster-a"),
        ("beta", "cluster-a"),
    ]
    alpha = objs[0]
    assert alpha["kind"] == "ProjectPeer" and alpha["apiVersion"] == "peering.deckhouse.io/v1alpha1"
    assert alpha["metadata"]["labels"]["peering.deckhouse.io/clusterpeer"] == "cluster-a"
    assert alpha["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert alpha["status"]["state"] == "Paired"
    assert alpha["status"]["clusterUUID"] == "b-uuid"
    assert alpha["status"]["remoteNamespaces"] == ["alpha", "alpha-cache"]
    assert alpha["status"]["capabilities"] == [
        {"name": "mixed", "version": "v2", "scope": ["cluster", "project"]},
        {"name": "storage", "version": "v1", "scope": ["project"]},
    ]
    assert "cluster-b" in alpha["status"]["message"]


def test_unreachable_peer_keeps_pairs():
    pairs = pr.pair_projects(LOCAL, PEER)
    objs = pr.desired_project_peers(
        CP, "b-uuid", pairs, EFF, reachable=False, reason="PeerRefusedCertificate", message="revoked?"
    )
    assert {o["status"]["state"] for o in objs} == {"PeerUnreachable"}
    assert objs[0]["status"]["reason"] == "PeerRefusedCertificate" and objs[0]["status"]["message"] == "revoked?"
    default = pr.desired_project_peers(CP, "b-uuid", pairs, EFF, reachable=False)
    assert default[0]["status"]["reason"] == "PeerUnreachable" and "retried" in default[0]["status"]["message"]


def _stored(objs):
    out = copy.deepcopy(objs)
    for o in out:
        o["metadata"]["resourceVersion"] = "5"
    return out


def test_lost_project_removes_its_project_peer():
    before = pr.desired_project_peers(CP, "b-uuid", pr.pair_projects(LOCAL, PEER), EFF, reachable=True)
    peer_lost_beta = [p for p in PEER if not (isinstance(p, dict) and p["name"] == "beta")]
    after = pr.desired_project_peers(CP, "b-uuid", pr.pair_projects(LOCAL, peer_lost_beta), EFF, reachable=True)
    d = diff_objects(after, _stored(before), "cluster-a")
    assert [(o["metadata"]["namespace"]) for o in d.delete] == ["beta"]
    assert d.create == [] and d.update == []
    local_lost_alpha = {k: v for k, v in LOCAL.items() if k != "alpha"}
    after = pr.desired_project_peers(CP, "b-uuid", pr.pair_projects(local_lost_alpha, PEER), EFF, reachable=True)
    assert [o["metadata"]["namespace"] for o in diff_objects(after, _stored(before), "cluster-a").delete] == ["alpha"]


def test_status_updates_only_when_changed():
    pairs = pr.pair_projects(LOCAL, PEER)
    paired = pr.desired_project_peers(CP, "b-uuid", pairs, EFF, reachable=True)
    assert pr.status_updates(paired, _stored(paired)) == []
    down = pr.desired_project_peers(CP, "b-uuid", pairs, EFF, reachable=False)
    ups = pr.status_updates(down, _stored(paired))
    assert len(ups) == 2 and all(u["metadata"]["resourceVersion"] == "5" for u in ups)
    assert pr.status_updates(down, []) == []
