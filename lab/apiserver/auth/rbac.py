"""RBAC authorization as kube-apiserver evaluates it, over the Role/ClusterRole/binding objects the core stores.

Everything here is a plain function over object dicts except `Authorizer`, which only reads the current objects
through the core's `list_objects` on each call (the store is in memory, and reading fresh means a deleted binding
stops granting at once, as in kube-apiserver). The rule semantics follow kube-apiserver's RBAC authorizer and its
escalation prevention, including their corner cases: `*` in resources covers subresources, `*/status` covers one
subresource of every resource, resourceNames never match a request without a name, a RoleBinding grants a
ClusterRole's rules only in its own namespace, and nonResourceURLs end in `*` for a prefix.
"""

from __future__ import annotations

import copy
from typing import Iterable, Mapping

from lab.apiserver.auth.tokens import sa_username
from lab.apiserver.auth.types import Attributes, Decision, ListObjects, UserInfo
from lab.apiserver.errors import ApiError
from lab.apiserver.causes import go_strings

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
SERVICEACCOUNTS = "system:serviceaccounts"
ALL = "*"

READ = ["get", "list", "watch"]
WRITE = ["create", "update", "patch", "delete", "deletecollection"]

# The subject of a binding, in kube-apiserver's reason strings.
_SUBJECT_KINDS = ("User", "Group", "ServiceAccount")


# --- rule matching -------------------------------------------------------------------------------------------
def verb_matches(rule: Mapping, verb: str) -> bool:
    verbs = rule.get("verbs") or ()
    return ALL in verbs or verb in verbs


def api_group_matches(rule: Mapping, group: str) -> bool:
    groups = rule.get("apiGroups") or ()
    return ALL in groups or group in groups


def resource_matches(rule: Mapping, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for granted in rule.get("resources") or ():
        if granted == ALL or granted == combined:
            return True
        # `*/scale` grants the scale subresource of every resource, and nothing else.
        if subresource and granted == "*/" + subresource:
            return True
    return False


def resource_name_matches(rule: Mapping, name: str) -> bool:
    names = rule.get("resourceNames") or ()
    # A rule limited to names can never grant list, watch-all or create, which carry no name.
    return not names or name in names


def non_resource_url_matches(rule: Mapping, path: str) -> bool:
    for granted in rule.get("nonResourceURLs") or ():
        if granted == ALL or granted == path:
            return True
        if granted.endswith("*") and path.startswith(granted.rstrip("*")):
            return True
    return False


def rule_allows(rule: Mapping, attrs: Attributes) -> bool:
    """Whether one PolicyRule grants the request (kube-apiserver's RuleAllows)."""
    if not verb_matches(rule, attrs.verb):
        return False
    if attrs.resource_request:
        return (api_group_matches(rule, attrs.api_group)
                and resource_matches(rule, attrs.resource, attrs.subresource)
                and resource_name_matches(rule, attrs.name))
    return non_resource_url_matches(rule, attrs.path)


# --- subjects, selectors, aggregation -------------------------------------------------------------------------
def subject_matches(subject: Mapping, user: UserInfo, binding_namespace: str) -> bool:
    """Whether a binding's subject is this user. A ServiceAccount subject without a namespace is in the binding's."""
    kind = subject.get("kind")
    name = subject.get("name", "")
    if kind == "User":
        return name == user.username
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and sa_username(namespace, name) == user.username
    return False


def label_selector_matches(selector: Mapping | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: an empty selector matches everything, a missing one nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        present = key in labels
        if op == "In":
            ok = present and labels[key] in values
        elif op == "NotIn":
            ok = not present or labels[key] not in values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            ok = False  # an unknown operator selects nothing rather than everything
        if not ok:
            return False
    return True


def _labels(obj: Mapping) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def object_name(obj: Mapping) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _namespace(obj: Mapping) -> str:
    return (obj.get("metadata") or {}).get("namespace") or ""


class ClusterRoleIndex:
    """The effective rules of ClusterRoles by name, with aggregationRule resolved on demand.

    An aggregated ClusterRole's rules are the union of the rules of every other ClusterRole its selectors match,
    its own stored rules replaced (as kube-controller-manager's aggregation controller writes them). Aggregated
    roles may select aggregated roles (admin selects edit, which selects view); a cycle adds nothing twice.
    Returned rule lists are shared: callers must not change them.
    """

    def __init__(self, cluster_roles: Iterable[Mapping]) -> None:
        self._by_name = {object_name(r): r for r in cluster_roles}
        self._resolved: dict[str, list[dict]] = {}

    def names(self) -> list[str]:
        return list(self._by_name)

    def rules(self, name: str) -> list[dict] | None:
        if name not in self._by_name:
            return None
        return self._rules(name, frozenset())

    def _rules(self, name: str, visiting: frozenset[str]) -> list[dict]:
        if name in self._resolved:
            return self._resolved[name]
        role = self._by_name[name]
        aggregation = role.get("aggregationRule")
        if not aggregation:
            rules = list(role.get("rules") or ())
        else:
            rules = []
            selectors = aggregation.get("clusterRoleSelectors") or []
            for other in sorted(self._by_name):
                if other == name or other in visiting:
                    continue
                if any(label_selector_matches(sel, _labels(self._by_name[other])) for sel in selectors):
                    for rule in self._rules(other, visiting | {name}):
                        if rule not in rules:
                            rules.append(rule)
        if not visiting or not aggregation:
            # Inside a cycle an aggregated role's answer is partial (the cycle is cut there): never cache it.
            self._resolved[name] = rules
        return rules


def aggregate_cluster_roles(cluster_roles: Iterable[Mapping]) -> dict[str, list[dict]]:
    """The effective rules of every ClusterRole by name (fresh copies), as the aggregation controller fills them."""
    index = ClusterRoleIndex(cluster_roles)
    return {name: copy.deepcopy(index.rules(name)) for name in index.names()}


# --- escalation ----------------------------------------------------------------------------------------------
def breakdown_rule(rule: Mapping) -> list[dict]:
    """One PolicyRule split into rules of one verb, group, resource and name (or one verb and URL) each."""
    out: list[dict] = []
    verbs = list(rule.get("verbs") or ())
    for group in rule.get("apiGroups") or ():
        for resource in rule.get("resources") or ():
            for verb in verbs:
                names = rule.get("resourceNames") or ()
                if names:
                    out.extend({"apiGroups": [group], "resources": [resource], "verbs": [verb],
                                "resourceNames": [n]} for n in names)
                else:
                    out.append({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
    for url in rule.get("nonResourceURLs") or ():
        out.extend({"nonResourceURLs": [url], "verbs": [verb]} for verb in verbs)
    return out


def _resources_cover(owner: list[str], wanted: list[str]) -> bool:
    if ALL in owner:
        return True
    for resource in wanted:
        if resource in owner:
            continue
        if "/" not in resource or "*/" + resource.split("/", 1)[1] not in owner:
            return False
    return True


def _url_covers(owner: str, wanted: str) -> bool:
    return owner == wanted or (owner.endswith("*") and wanted.startswith(owner.rstrip("*")))


def rule_covers(owner: Mapping, sub: Mapping) -> bool:
    """Whether holding owner gives everything sub gives (kube-apiserver's ruleCovers, for broken-down rules)."""
    owner_verbs = owner.get("verbs") or []
    owner_groups = owner.get("apiGroups") or []
    owner_names = owner.get("resourceNames") or []
    sub_names = sub.get("resourceNames") or []
    verbs_ok = ALL in owner_verbs or all(v in owner_verbs for v in sub.get("verbs") or ())
    groups_ok = ALL in owner_groups or all(g in owner_groups for g in sub.get("apiGroups") or ())
    resources_ok = _resources_cover(list(owner.get("resources") or []), list(sub.get("resources") or []))
    urls_ok = all(any(_url_covers(o, w) for o in owner.get("nonResourceURLs") or ())
                  for w in sub.get("nonResourceURLs") or ())
    names_ok = not owner_names or (bool(sub_names) and all(n in owner_names for n in sub_names))
    return verbs_ok and groups_ok and resources_ok and urls_ok and names_ok


def uncovered_rules(owner_rules: Iterable[Mapping], requested: Iterable[Mapping]) -> list[dict]:
    """The broken-down parts of the requested rules that no owner rule covers; empty means no escalation."""
    owner_rules = list(owner_rules)
    missing: list[dict] = []
    for rule in requested:
        for sub in breakdown_rule(rule):
            if not any(rule_covers(o, sub) for o in owner_rules) and sub not in missing:
                missing.append(sub)
    return missing


def compact_rules(rules: list[Mapping]) -> list[dict]:
    """Rules of one API group and one resource (no names, no URLs) merged into one rule per pair, their verbs in
    order, as kube-apiserver compacts the rules it reports missing."""
    merged: dict[tuple[str, str], dict] = {}
    out: list[dict] = []
    for rule in rules:
        groups, resources = list(rule.get("apiGroups") or ()), list(rule.get("resources") or ())
        if len(groups) == 1 and len(resources) == 1 and not rule.get("resourceNames") and \
                not rule.get("nonResourceURLs"):
            key = (groups[0], resources[0])
            if key not in merged:
                merged[key] = {"apiGroups": groups, "resources": resources, "verbs": []}
                out.append(merged[key])
            merged[key]["verbs"] += [v for v in rule.get("verbs") or () if v not in merged[key]["verbs"]]
        else:
            out.append(dict(rule))
    return out


def _compact(rule: Mapping) -> str:
    """A rule as kube-apiserver's escalation message prints it (rbac's PolicyRule compact string)."""
    parts = []
    for key, shown in (("apiGroups", "APIGroups"), ("resources", "Resources"), ("resourceNames", "ResourceNames"),
                       ("nonResourceURLs", "NonResourceURLs"), ("verbs", "Verbs")):
        if rule.get(key):
            parts.append(f"{shown}:{go_strings(rule[key])}")
    return "{" + ", ".join(parts) + "}"


# --- the authorizer ------------------------------------------------------------------------------------------
class Authorizer:
    """Decides requests by the RBAC objects in the store, plus the `system:masters` group that is always allowed."""

    def __init__(self, list_objects: ListObjects) -> None:
        self._list = list_objects
        self._index_key: tuple | None = None
        self._index: ClusterRoleIndex | None = None

    def _cluster_roles(self) -> ClusterRoleIndex:
        """The ClusterRole index, reused while no ClusterRole changed (every stored object has a resourceVersion;
        objects without one, as in unit tests, are indexed afresh on each call)."""
        roles = list(self._list(RBAC_GROUP, "clusterroles", None))
        versions = tuple(((r.get("metadata") or {}).get("uid"), (r.get("metadata") or {}).get("resourceVersion"))
                         for r in roles)
        if all(rv for _, rv in versions):
            if self._index is None or versions != self._index_key:
                self._index, self._index_key = ClusterRoleIndex(roles), versions
            return self._index
        return ClusterRoleIndex(roles)

    def _role_rules(self, namespace: str, name: str) -> list[dict] | None:
        for role in self._list(RBAC_GROUP, "roles", namespace):
            if object_name(role) == name:
                return list(role.get("rules") or ())
        return None

    def _bindings(self, user: UserInfo, namespace: str):
        """(binding kind, binding, matched subject, role kind, role name, rules or None) for each binding of user."""
        cluster_roles = self._cluster_roles()
        sources = [("ClusterRoleBinding", b) for b in self._list(RBAC_GROUP, "clusterrolebindings", None)]
        if namespace:
            sources += [("RoleBinding", b) for b in self._list(RBAC_GROUP, "rolebindings", namespace)]
        for kind, binding in sources:
            binding_ns = _namespace(binding) if kind == "RoleBinding" else ""
            subject = next((s for s in binding.get("subjects") or () if subject_matches(s, user, binding_ns)), None)
            if subject is None:
                continue
            ref = binding.get("roleRef") or {}
            ref_kind, ref_name = ref.get("kind", ""), ref.get("name", "")
            if ref_kind == "ClusterRole":
                rules = cluster_roles.rules(ref_name)
            elif ref_kind == "Role" and kind == "RoleBinding":
                rules = self._role_rules(binding_ns, ref_name)
            else:
                rules = None
            yield kind, binding, subject, ref_kind, ref_name, rules

    def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
        if MASTERS in user.groups:
            # kube-apiserver's privileged-group authorizer, before RBAC: it allows and gives no reason.
            return Decision(True, "")
        errors: list[str] = []
        for kind, binding, subject, ref_kind, ref_name, rules in self._bindings(user, attrs.namespace):
            if rules is None:
                errors.append(f'{ref_kind.lower()}.{RBAC_GROUP} "{ref_name}" not found')
                continue
            if any(rule_allows(r, attrs) for r in rules):
                where = object_name(binding) if kind == "ClusterRoleBinding" \
                    else f"{object_name(binding)}/{_namespace(binding)}"
                return Decision(True, f'RBAC: allowed by {kind} "{where}" of {ref_kind} "{ref_name}" '
                                      f'to {subject.get("kind")} "{subject.get("name")}"')
        return Decision(False, "RBAC: " + ", ".join(errors) if errors else "")

    def rules_for(self, user: UserInfo, namespace: str = "") -> tuple[list[dict], bool]:
        """Every rule the user holds in namespace ("" for cluster-wide only); and whether some could not be read.

        `system:masters` is not an RBAC grant and is not included; callers that list rules for display add it.
        """
        rules: list[dict] = []
        incomplete = False
        for _kind, _binding, _subject, _ref_kind, _ref_name, found in self._bindings(user, namespace):
            if found is None:
                incomplete = True
                continue
            for rule in found:
                if rule not in rules:
                    rules.append(rule)
        return rules, incomplete

    def escalation_check(self, user: UserInfo, rules: list[dict], *, namespace: str = "") -> Decision:
        """Whether the user already holds every rule it wants to grant, in namespace ("" for cluster-wide).

        This is RBAC's escalation prevention on its own; `check_role_write` and `check_binding_write` add the
        `escalate` and `bind` verbs that let a user grant what it does not hold.
        """
        if MASTERS in user.groups:
            return Decision(True, f"allowed by the {MASTERS} group")
        held, incomplete = self.rules_for(user, namespace)
        missing = uncovered_rules(held, rules)
        if not missing:
            return Decision(True, "the user holds every rule it grants")
        message = (f'user "{user.username}" (groups={go_strings(user.groups)}) is attempting to grant RBAC '
                   f'permissions not currently held:\n' + "\n".join(sorted({_compact(m) for m in
                                                                             compact_rules(missing)})))
        if incomplete:
            message += "; some of the user's bindings name roles that do not exist"
        return Decision(False, message)

    def check_role_write(self, user: UserInfo, role: Mapping) -> Decision:
        """May the user create or update this Role or ClusterRole? Holding its rules, or `escalate` on it."""
        is_cluster = role.get("kind") == "ClusterRole"
        namespace = "" if is_cluster else _namespace(role)
        escalate = Attributes(verb="escalate", resource_request=True, api_group=RBAC_GROUP,
                              resource="clusterroles" if is_cluster else "roles", namespace=namespace,
                              name=object_name(role))
        if self.authorize(user, escalate).allowed:
            return Decision(True, "the user may escalate on this role")
        if is_cluster and role.get("aggregationRule"):
            # Aggregation pulls in rules of roles the writer may never have seen; kube-apiserver allows it only to
            # those who could escalate anyway.
            return Decision(False, "must have cluster-admin privileges to use the aggregationRule")
        return self.escalation_check(user, list(role.get("rules") or ()), namespace=namespace)

    def check_binding_write(self, user: UserInfo, binding: Mapping) -> Decision:
        """May the user create or update this RoleBinding or ClusterRoleBinding? `bind` on its role, or its rules."""
        is_cluster = binding.get("kind") == "ClusterRoleBinding"
        namespace = "" if is_cluster else _namespace(binding)
        ref = binding.get("roleRef") or {}
        ref_kind, ref_name = ref.get("kind", ""), ref.get("name", "")
        if ref_kind not in ("Role", "ClusterRole") or (is_cluster and ref_kind != "ClusterRole"):
            return Decision(False, f"roleRef.kind must be ClusterRole{'' if is_cluster else ' or Role'}, "
                                   f"not {ref_kind or 'empty'}")
        bind = Attributes(verb="bind", resource_request=True, api_group=RBAC_GROUP,
                          resource="clusterroles" if ref_kind == "ClusterRole" else "roles",
                          namespace=namespace, name=ref_name)
        if MASTERS in user.groups or self.authorize(user, bind).allowed:
            return Decision(True, "the user may bind this role")
        if ref_kind == "ClusterRole":
            rules = self._cluster_roles().rules(ref_name)
        else:
            rules = self._role_rules(namespace, ref_name)
        if rules is None:
            return Decision(False, f'{ref_kind.lower()}.{RBAC_GROUP} "{ref_name}" not found', missing_role=ref_name)
        return self.escalation_check(user, rules, namespace=namespace)


# --- messages --------------------------------------------------------------------------------------------------
def forbidden_message(user: UserInfo, attrs: Attributes, reason: str = "") -> str:
    """kube-apiserver's words for a denied request, e.g. `User "x" cannot list resource "pods" in API group ""...`."""
    if not attrs.resource_request:
        msg = f'User "{user.username}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        msg = f'User "{user.username}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.api_group}" {where}'
    return f"{msg}: {reason}" if reason else msg


def forbidden(user: UserInfo, attrs: Attributes, reason: str = "") -> ApiError:
    """The 403 Status kube-apiserver answers for a denied request."""
    msg = forbidden_message(user, attrs, reason)
    resource = attrs.resource if attrs.resource_request else ""
    qualified = f"{resource}.{attrs.api_group}" if attrs.api_group and resource else resource
    if not qualified:
        text = f"forbidden: {msg}"
    elif not attrs.name:
        text = f"{qualified} is forbidden: {msg}"
    else:
        text = f'{qualified} "{attrs.name}" is forbidden: {msg}'
    from lab.apiserver.errors import details
    return ApiError(403, "Forbidden", text, details(attrs.name or "", attrs.api_group, resource))
