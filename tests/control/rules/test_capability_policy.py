"""The capability policy: every row of its table refused, what it leaves allowed accepted, the
nonResourceURLs shared only with get, and docs/capability-policy.md the same table as the code."""

from __future__ import annotations

import pathlib
import re

import pytest

from control.rules import capabilities as caps
from control.rules import capability_policy as policy

ROOT = pathlib.Path(__file__).resolve().parents[3]
PAGE = (ROOT / "docs" / "capability-policy.md").read_text()
CONSUMERS = [{"kind": "ServiceAccount", "namespace": "d8-mod", "name": "controller"}]
READS = ["get", "list", "watch"]
BENIGN = {"apiGroups": [""], "resources": ["configmaps"], "verbs": READS}


def verdict(*rules):
    return caps.validate({"version": "v1", "rules": [BENIGN, *rules], "consumers": CONSUMERS})


def rule(group: str, resource: str, verbs) -> dict:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


def refused(v, *words):
    assert (v.status, v.reason) == ("False", "PrivilegeEscalation"), v.message
    assert "rule 2" in v.message
    for word in words:
        assert word in v.message, (word, v.message)


def _row_id(row: policy.Row) -> str:
    return row.verb or f"{row.group or 'core'}/{row.resource or '*'}"


def _resource_of(row: policy.Row) -> str:
    # A group row covers every resource of its group: any name of it is refused.
    return row.resource or "anything"


@pytest.mark.parametrize("row", policy.POLICY, ids=_row_id)
def test_every_row_of_the_table_is_refused_with_why_and_what_to_do(row):
    if row.verb is not None:
        the_rule = rule("", "configmaps", [row.verb])
    else:
        the_rule = rule(row.group, _resource_of(row), ["create"] if row.verbs == policy.WRITES else ["get"])
    refused(verdict(the_rule), row.why, "instead, " + row.instead)


@pytest.mark.parametrize("row", [r for r in policy.POLICY if r.resource], ids=_row_id)
def test_a_row_covers_the_subresources_of_its_resource(row):
    verbs = ["patch"] if row.verbs == policy.WRITES else ["get"]
    refused(verdict(rule(row.group, row.resource + "/status", verbs)), row.why)


@pytest.mark.parametrize("row", [r for r in policy.POLICY if r.verbs == policy.WRITES], ids=_row_id)
def test_reading_what_a_writes_row_refuses_stays_allowed(row):
    assert verdict(rule(row.group, row.resource, READS)).accepted


@pytest.mark.parametrize("row", [r for r in policy.POLICY if r.verbs == policy.WRITES], ids=_row_id)
@pytest.mark.parametrize("verb", sorted(policy.WRITE_VERBS))
def test_every_write_verb_is_refused(row, verb):
    refused(verdict(rule(row.group, row.resource, ["get", verb])), row.why)


@pytest.mark.parametrize("url", policy.SHARED_URLS)
def test_a_shared_url_is_accepted_with_get_only(url):
    assert verdict({"nonResourceURLs": [url], "verbs": ["get"]}).accepted
    for verb in sorted(caps.NON_RESOURCE_VERBS - {"get"}):
        refused(verdict({"nonResourceURLs": [url], "verbs": ["get", verb]}), f"grants {verb} on {url}", "get only")


@pytest.mark.parametrize("url", policy.REFUSED_URLS)
def test_a_refused_url_is_refused_below_it_too(url):
    why = policy.REFUSED_URLS[url][0]
    refused(verdict({"nonResourceURLs": [url], "verbs": ["get"]}), url, why, "/version")
    refused(verdict({"nonResourceURLs": [url + "/x"], "verbs": ["get"]}), why)


# Written by hand, apart from the table: what a reviewer expects, each with the words it must say.
@pytest.mark.parametrize(
    ("the_rule", "words"),
    [
        ({"nonResourceURLs": ["/logs"], "verbs": ["get"]}, ["/logs", "log files"]),
        ({"nonResourceURLs": ["/logs/kube-apiserver.log"], "verbs": ["get"]}, ["log files"]),
        ({"nonResourceURLs": ["/debug/pprof"], "verbs": ["get"]}, ["heap dumps"]),
        ({"nonResourceURLs": ["/debug/pprof/heap"], "verbs": ["get"]}, ["heap dumps"]),
        ({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, ["/metrics"]),
        ({"nonResourceURLs": ["/openapi/v2"], "verbs": ["get"]}, ["a capability may not grant", "need no rule"]),
        ({"nonResourceURLs": ["/healthz/etcd"], "verbs": ["get"]}, ["a capability may not grant"]),
        ({"nonResourceURLs": ["/version"], "verbs": ["post"]}, ["only get"]),
        ({"nonResourceURLs": ["/version", "/metrics"], "verbs": ["get"]}, ["/metrics"]),
        (rule("", "services", ["create"]), ["CVE-2020-8554", "services"]),
        (rule("", "services", ["patch"]), ["CVE-2020-8554"]),
        (rule("", "services/status", ["update"]), ["CVE-2020-8554", "load balancer"]),
        (rule("", "endpoints", ["update"]), ["CVE-2021-25740"]),
        (rule("discovery.k8s.io", "endpointslices", ["create"]), ["CVE-2021-25740", "endpointslices.discovery.k8s.io"]),
        (rule("", "bindings", ["create"]), ["scheduler"]),
        (rule("", "pods/binding", ["create"]), ["scheduler"]),
        (rule("scheduling.k8s.io", "priorityclasses", ["create"]), ["preempt"]),
        (rule("node.k8s.io", "runtimeclasses", ["create"]), ["runtime"]),
        (rule("flowcontrol.apiserver.k8s.io", "flowschemas", ["update"]), ["Fairness"]),
        (rule("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", ["patch"]), ["Fairness"]),
        (rule("storage.k8s.io", "storageclasses", ["create"]), ["provisioner"]),
        (rule("storage.k8s.io", "volumeattachments", ["create"]), ["attaches"]),
        (rule("storage.k8s.io", "csidrivers", ["create"]), ["CSI"]),
        (rule("storage.k8s.io", "csinodes", ["update"]), ["scheduler"]),
        (rule("storage.k8s.io", "csistoragecapacities", ["create"]), ["scheduler"]),
        (rule("deckhouse.io", "nodegroups", ["patch"]), ["taints"]),
        (rule("deckhouse.io", "nodegroupconfigurations", ["get"]), ["root"]),
        (rule("deckhouse.io", "modulesources", ["list"]), ["registry"]),
        (rule("deckhouse.io", "moduleupdatepolicies", ["create"]), ["release"]),
        (rule("deckhouse.io", "moduleconfigs", ["get"]), ["protections"]),
        (rule("deckhouse.io", "sshcredentials", ["get"]), ["SSH keys"]),
        (rule("deckhouse.io", "clusterloggingconfigs", ["create"]), ["logs"]),
        (rule("deckhouse.io", "nodeusers", ["create"]), ["sudo"]),
        (rule("", "Secrets", ["get"]), ["Secrets"]),  # RBAC names are lower-case; refused all the same
        (rule("", "nodes/status", ["patch"]), ["nodes/status"]),
        (rule("", "serviceaccounts", ["impersonate"]), ["impersonate", "instead"]),
        (rule("rbac.authorization.k8s.io", "roles", ["get"]), ["the API group rbac.authorization.k8s.io", "RBAC"]),
    ],
)
def test_hand_written_refusals(the_rule, words):
    refused(verdict(the_rule), *words)


@pytest.mark.parametrize(
    "the_rule",
    [
        rule("", "services", READS),
        rule("", "endpoints", ["list"]),
        rule("discovery.k8s.io", "endpointslices", ["watch"]),
        rule("storage.k8s.io", "storageclasses", ["get"]),
        rule("deckhouse.io", "nodegroups", ["get", "list"]),
        rule("scheduling.k8s.io", "priorityclasses", ["get"]),
        rule("", "pods", ["create", "delete"]),
        rule("", "pods/log", ["get"]),
        rule("apps", "deployments", ["create", "update", "patch"]),
        rule("deckhouse.io", "somethingofmine", ["create"]),
        {"nonResourceURLs": ["/version", "/healthz", "/readyz", "/livez", "/api", "/apis"], "verbs": ["get"]},
    ],
)
def test_what_the_policy_leaves_allowed(the_rule):
    v = verdict(the_rule)
    assert v.accepted, v.message


def test_a_rule_hitting_several_rows_names_each_once():
    v = verdict(rule("", "services", ["create"]) | {"resources": ["services", "services/status", "endpoints"]})
    refused(v, "CVE-2020-8554", "CVE-2021-25740")
    assert v.message.count("CVE-2020-8554") == 1


def test_the_page_shows_the_classes_the_policy_table_and_the_shared_urls_as_the_code_has_them():
    assert policy.classes.classes_table() in PAGE, "docs/capability-policy.md: paste `peering capability-policy`"
    assert policy.markdown_table() in PAGE, "docs/capability-policy.md: paste `peering capability-policy`"
    assert policy.shared_urls_table() in PAGE
    rows = [line for line in PAGE.splitlines() if line.startswith("| ") and not line.startswith(("| kind", "| class"))]
    assert len(rows) == (len(policy.classes.CLASSES) + len(policy.POLICY) + len(policy.REFUSED_URLS) + 2 + 1
                         + len(policy.SHARED_URLS))
    for group in ("deckhouse.io", "discovery.k8s.io", "storage.k8s.io", "flowcontrol.apiserver.k8s.io"):
        assert f"`{group}`" in PAGE


def test_the_page_example_is_the_message_the_module_writes():
    example = re.search(r"```\n(rule 2 writes services.*?)\n```", PAGE, re.S).group(1)
    v = caps.validate({"version": "v1", "rules": [BENIGN, rule("", "services", ["create"])], "consumers": CONSUMERS})
    assert " ".join(example.split()) == v.message


def test_the_table_has_no_row_twice_and_each_row_says_why_and_what_to_do():
    keys = [(r.group, r.resource, r.verb) for r in policy.POLICY]
    assert len(keys) == len(set(keys))
    for row in policy.POLICY:
        assert row.why and row.mechanism and row.instead and "|" not in row.why + row.mechanism + row.instead
    assert caps.ESCALATING_VERBS == {"escalate", "bind", "impersonate", "approve", "sign", "attest", "use"}


def test_peering_capability_policy_prints_the_tables(capsys):
    from control import cli

    assert cli.main(["capability-policy"]) == 0
    assert capsys.readouterr().out == (policy.classes.classes_table() + "\n" + policy.markdown_table() + "\n"
                                       + policy.shared_urls_table())
