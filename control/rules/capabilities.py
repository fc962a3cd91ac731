"""PeeringCapability validation (its Accepted condition) and scope.

A capability is a set of RBAC rules that the consumers of a peer get here. It is refused when the rules could
reach beyond themselves: wildcards, and whatever the capability policy refuses (control/rules/capability_policy.py
and the classes of control/rules/capability_classes.py, shown as tables in docs/capability-policy.md). The policy
decides by the class of what a rule names: identity and RBAC, credentials, admission, the API itself, the
module's own resources, Deckhouse's configuration, releases and machines, shells into workloads, and the writes
that route traffic, schedule, reach other tenants' storage, change tenancy or steer monitoring; verbs that grant
or assume other identities; a write on any cluster-scoped object; and every nonResourceURL but `get` on a short
list that every authenticated identity may read anyway.

The Accepted condition is decided from the spec and the policy's tables of what kube-apiserver and Deckhouse
serve. Where the capability is granted (`validated_capability`), discovery also gives the scope of kinds those
tables do not know, so that a write on an unknown cluster-scoped kind is refused there too.

Workloads (pods, deployments and the like) are allowed: refusing them would refuse most useful capabilities. A
capability that creates pods can run them as any ServiceAccount of the namespaces it applies to; opening such a
capability is the administrator's decision, and the ACCEPTED column does not vouch for it.

Secrets are refused for every verb and scope: a Secret may hold a ServiceAccount token or a kubeconfig of a far
more privileged identity, and the peer's module would then act as that identity. A module that must move Secrets
between clusters should declare a narrower resource of its own.

Scope: a rule on a namespaced resource is `project`, on a cluster-scoped resource or nonResourceURLs `cluster`.
A resource that discovery does not know (a CRD not installed yet) counts as `project`: a Role that names a
cluster-scoped resource grants nothing, so an unknown resource fails closed instead of becoming a ClusterRole
over every namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from control.rules import capability_policy as policy

#: (apiGroup, resource) -> True namespaced, False cluster-scoped, None unknown.
Namespaced = Callable[[str, str], "bool | None"]

KNOWN_VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
)
NON_RESOURCE_VERBS = frozenset({"get", "head", "options", "post", "put", "patch", "delete"})
#: Verbs that grant or assume other identities: the verb rows of the policy.
ESCALATING_VERBS = frozenset(row.verb for row in policy.POLICY if row.verb is not None)
WRITE_VERBS = policy.WRITE_VERBS

# Reasons of the Accepted condition, most severe first: a capability with several problems reports the first.
ACCEPTED = "Accepted"
WILDCARD = "Wildcard"
PRIVILEGE_ESCALATION = "PrivilegeEscalation"
INVALID_RULE = "InvalidRule"
INVALID_CONSUMER = "InvalidConsumer"
INVALID_VERSION = "InvalidVersion"
EMPTY_RULES = "EmptyRules"
NO_CONSUMERS = "NoConsumers"
_SEVERITY = [WILDCARD, PRIVILEGE_ESCALATION, INVALID_RULE, INVALID_CONSUMER, INVALID_VERSION, EMPTY_RULES, NO_CONSUMERS]
MAX_PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class Verdict:
    """The Accepted condition of a PeeringCapability."""

    status: str  # "True" or "False"
    reason: str
    message: str

    @property
    def accepted(self) -> bool:
        return self.status == "True"


def _strings(value) -> list[str] | None:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def _rule_problems(i: int, rule, namespaced: Namespaced | None = None) -> list[tuple[str, str]]:
    where = f"rule {i + 1}"
    if not isinstance(rule, dict):
        return [(INVALID_RULE, f"{where} is not an object")]
    fields = {k: _strings(rule.get(k)) for k in ("apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs")}
    bad = [k for k, v in fields.items() if v is None]
    if bad:
        return [(INVALID_RULE, f"{where}: {', '.join(bad)} must be lists of strings")]
    groups, resources, names, urls, verbs = (fields[k] for k in fields)
    out: list[tuple[str, str]] = []

    starred = [f"{k} {v!r}" for k in ("apiGroups", "resources", "verbs", "nonResourceURLs") for v in fields[k] if "*" in v]
    if starred:
        out.append((WILDCARD, f"{where} uses wildcards ({', '.join(starred)}); list the exact verbs and resources"))

    if not verbs:
        out.append((INVALID_RULE, f"{where} has no verbs"))
    if bool(resources) == bool(urls):
        out.append((INVALID_RULE, f"{where} must name either resources or nonResourceURLs, exactly one of them"))
    if resources and not groups:
        out.append((INVALID_RULE, f"{where} names resources without apiGroups; use \"\" for the core group"))
    if urls and (groups or names):
        out.append((INVALID_RULE, f"{where} mixes nonResourceURLs with apiGroups or resourceNames"))
    if any(not r for r in resources) or any(not v for v in verbs):
        out.append((INVALID_RULE, f"{where} has an empty resource or verb"))
    if any(not u.startswith("/") for u in urls):
        out.append((INVALID_RULE, f"{where}: nonResourceURLs must start with /"))

    allowed = NON_RESOURCE_VERBS if urls else KNOWN_VERBS
    unknown = sorted(set(verbs) - allowed - ESCALATING_VERBS)
    if unknown and not any("*" in v for v in unknown):
        out.append((INVALID_RULE, f"{where} has unknown verbs {', '.join(unknown)}; use {', '.join(sorted(allowed))}"))
    out.extend((PRIVILEGE_ESCALATION, text)
               for text in _policy_problems(where, groups, resources, urls, verbs, namespaced))
    return out


def _policy_problems(where: str, groups: list[str], resources: list[str], urls: list[str], verbs: list[str],
                     namespaced: Namespaced | None = None):
    """The rule's refusals by the capability policy (control/rules/capability_policy.py): one per row it hits,
    and one per class that refuses it apart from those rows, naming the resources it refuses them for."""
    verb_set = set(verbs)
    for row in policy.POLICY:
        if row.verb is not None and row.verb in verb_set:
            yield f"{where} uses the verb {row.verb}: {row.why}; instead, {row.instead}"
    if urls:
        # Only well-formed URLs: a wildcard or a missing / is reported as such, and unknown verbs as InvalidRule.
        url_verbs = verb_set & (NON_RESOURCE_VERBS - ESCALATING_VERBS)
        for url in urls:
            if url.startswith("/") and "*" not in url and url_verbs:
                refusal = policy.url_refusal(url, url_verbs)
                if refusal:
                    yield f"{where} {refusal}"
        return
    by_class: dict[tuple[str, str], list[str]] = {}
    seen: set[policy.Row] = set()
    for g in groups:
        for r in resources:
            for refusal in policy.refusals(g, r.lower(), verb_set, namespaced):
                row = refusal.row
                if row is None:
                    by_class.setdefault((refusal.cls.name, g), []).append(_gr(g, r))
                elif row not in seen:
                    seen.add(row)
                    action = "writes" if row.verbs == policy.WRITES else "names"
                    what = f"the API group {g}" if row.resource is None else _gr(g, r)
                    yield (f"{where} {action} {what} (class {row.cls}): {row.why} ({row.mechanism}); "
                           f"instead, {row.instead}")
    for (name, _), whats in by_class.items():
        cls = policy.classes.CLASSES[name]
        action = "writes" if cls.refuses == policy.WRITES else "names"
        yield f"{where} {action} {', '.join(whats)} (class {name}): {cls.why}; instead, {cls.instead}"


def _gr(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def _consumer_problems(consumers) -> list[tuple[str, str]]:
    if not isinstance(consumers, list):
        return [(INVALID_CONSUMER, "spec.consumers must be a list")]
    out = []
    for i, c in enumerate(consumers):
        where = f"consumer {i + 1}"
        if not isinstance(c, dict):
            out.append((INVALID_CONSUMER, f"{where} is not an object"))
            continue
        if c.get("kind", "ServiceAccount") != "ServiceAccount":
            out.append((INVALID_CONSUMER, f"{where} has kind {c.get('kind')!r}; only ServiceAccount is supported"))
        if not isinstance(c.get("name"), str) or not c.get("name"):
            out.append((INVALID_CONSUMER, f"{where} has no name"))
        if not isinstance(c.get("namespace"), str) or not c.get("namespace"):
            out.append((INVALID_CONSUMER, f"{where} has no namespace"))
    return out


def validate(spec: dict | None, namespaced: Namespaced | None = None) -> Verdict:
    """The Accepted condition for a PeeringCapability's spec. `namespaced` (discovery) gives the scope of kinds the
    policy's tables do not know, so that a write on one that is cluster-scoped is refused; without it such a kind
    counts as namespaced, which is what split_rules makes of it too (a Role)."""
    spec = spec if isinstance(spec, dict) else {}
    problems: list[tuple[str, str]] = []
    version = spec.get("version")
    if not isinstance(version, str) or not version.strip():
        problems.append((INVALID_VERSION, "spec.version is empty; set the capability's version"))
    rules = spec.get("rules")
    if not rules:
        problems.append((EMPTY_RULES, "spec.rules is empty; a capability must grant something"))
    elif not isinstance(rules, list):
        problems.append((INVALID_RULE, "spec.rules must be a list"))
    else:
        for i, rule in enumerate(rules):
            problems.extend(_rule_problems(i, rule, namespaced))
    consumers = spec.get("consumers")
    if not consumers:
        problems.append((NO_CONSUMERS, "spec.consumers is empty; name the ServiceAccounts that use the capability"))
    else:
        problems.extend(_consumer_problems(consumers))
    if not problems:
        return Verdict("True", ACCEPTED, "the rules grant no more than they name; the capability can be opened")
    problems.sort(key=lambda p: _SEVERITY.index(p[0]))
    texts = [p[1] for p in problems[:MAX_PROBLEMS_SHOWN]]
    more = len(problems) - len(texts)
    tail = f"; and {more} more" if more > 0 else ""
    return Verdict(
        "False", problems[0][0], "; ".join(texts) + tail + ". Fix spec and the capability is validated again"
    )


def _base(resource: str) -> str:
    return resource.split("/", 1)[0]


def split_rules(rules: Iterable[dict], namespaced: Namespaced) -> dict[str, list[dict]]:
    """The rules split by scope: `project` rules go into Roles, `cluster` rules into ClusterRoles.

    Every output rule has one API group, so a namespaced resource never lands in a ClusterRole (where it would
    grant access in every namespace). Scopes without rules are absent.
    """
    out: dict[str, list[dict]] = {}
    for rule in rules or []:
        verbs = list(rule.get("verbs") or [])
        urls = list(rule.get("nonResourceURLs") or [])
        if urls:
            out.setdefault("cluster", []).append({"nonResourceURLs": urls, "verbs": verbs})
            continue
        for group in rule.get("apiGroups") or []:
            by_scope: dict[str, list[str]] = {}
            for resource in rule.get("resources") or []:
                is_ns = namespaced(group, _base(resource))
                by_scope.setdefault("cluster" if is_ns is False else "project", []).append(resource)
            for sc, resources in by_scope.items():
                r: dict = {"apiGroups": [group], "resources": resources, "verbs": verbs}
                if rule.get("resourceNames"):
                    r["resourceNames"] = list(rule["resourceNames"])
                out.setdefault(sc, []).append(r)
    return out


def scope(rules: Iterable[dict], namespaced: Namespaced) -> set[str]:
    """{"project"}, {"cluster"} or both: where the rules apply (see the module docstring for unknown resources)."""
    return set(split_rules(rules, namespaced))


@dataclass(frozen=True)
class ValidatedCapability:
    """A PeeringCapability of this cluster as the other rules need it: its verdict (Accepted or not), and for an
    accepted one its scope, consumers and rules split by scope."""

    name: str
    version: str
    verdict: Verdict
    scope: tuple[str, ...]  # sorted: ("cluster",), ("project",) or ("cluster", "project")
    consumers: tuple[tuple[str, str], ...]  # (namespace, name), sorted
    rules: tuple[tuple[str, tuple], ...] = ()  # (scope, rules as a tuple of frozen dict items) for grants

    @property
    def accepted(self) -> bool:
        return self.verdict.accepted

    def rules_for(self, scope_name: str) -> list[dict]:
        for sc, rules in self.rules:
            if sc == scope_name:
                return [_thaw(r) for r in rules]
        return []


def _freeze(rule: dict) -> tuple:
    return tuple(sorted((k, tuple(v)) for k, v in rule.items()))


def _thaw(rule: tuple) -> dict:
    return {k: list(v) for k, v in rule}


def validated_capability(obj: dict, namespaced: Namespaced) -> ValidatedCapability:
    """A ValidatedCapability from a PeeringCapability object as the API returns it."""
    spec = obj.get("spec") or {}
    verdict = validate(spec, namespaced)
    split = split_rules(spec.get("rules") or [], namespaced) if verdict.accepted else {}
    consumers = tuple(
        sorted(
            (c["namespace"], c["name"])
            for c in (spec.get("consumers") or [])
            if isinstance(c, dict) and c.get("namespace") and c.get("name")
        )
    )
    return ValidatedCapability(
        name=(obj.get("metadata") or {}).get("name", ""),
        version=str(spec.get("version") or ""),
        verdict=verdict,
        scope=tuple(sorted(split)),
        consumers=consumers,
        rules=tuple((sc, tuple(_freeze(r) for r in rules)) for sc, rules in sorted(split.items())),
    )


def validated_capabilities(objs: Iterable[dict], namespaced: Namespaced) -> dict[str, ValidatedCapability]:
    """This cluster's PeeringCapabilities by name."""
    return {c.name: c for c in (validated_capability(o, namespaced) for o in objs) if c.name}
