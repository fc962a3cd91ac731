"""The capability policy: what a PeeringCapability may not grant, decided by class, with its reasons as data.

Every resource belongs to a class of control/rules/capability_classes.py (routing traffic, credentials,
admission, releases, machines, storage, identity, ...) and the class decides whether a rule on it is refused:
for every verb, for the writes, or not at all. The resources with a reason of their own (a CVE, a mechanism)
are the rows of `POLICY`, each in its class; a row is never weaker than its class, and a resource a row names
is refused whenever the row or the resource's class refuses it. Verbs that grant or assume identities are rows
too, whatever resource they are on. A write on a cluster-scoped object is refused (`cluster-wide`) unless its
class already refuses it: no class allows one. A kind that no table knows is `unknown`: allowed in the paired
projects' namespaces, its writes refused when discovery says it is cluster-scoped.

`control/rules/capabilities.py` turns each refusal into the reason PrivilegeEscalation and a message built from
the row or the class: which rule, why it is refused, and what to do instead. docs/capability-policy.md shows
the classes and the rows (`classes_table()`, `markdown_table()`; a test holds the page to them). `peering
capability-policy` prints them, and `--resources` the verdict on every resource kube-apiserver and Deckhouse
serve (contract/served.py).

A row names an API group and a resource (None: every resource of the group; a resource matches its subresources
too, so `services` covers `services/status`), or a verb of any rule, and the verbs it refuses: all of them, or
the writes. nonResourceURLs are refused unless they are on the short `SHARED_URLS` list, and then only with `get`.
"""

from __future__ import annotations

from dataclasses import dataclass

from control.rules import capability_classes as classes
from contract import served

ALL = classes.ALL
WRITES = classes.WRITES
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: The group cell of a row that matches by verb, whatever the resource.
ANY_GROUP = "any"


@dataclass(frozen=True)
class Row:
    """One refusal: `verbs` ALL or WRITES for a (group, resource) row; for a verb row (`verb` set) the verb."""

    kind: str  # what a developer calls it: "Service", "the RBAC API group", "verb impersonate"
    group: str  # "" for the core group; ANY_GROUP for a verb row
    resource: str | None  # None: every resource of the group
    verbs: str  # ALL or WRITES
    why: str
    mechanism: str  # the CVE or the mechanism
    instead: str  # what a module developer does instead
    verb: str | None = None
    cls: str = ""  # the name of its class in capability_classes.CLASSES

    def names(self, group: str, resource: str) -> bool:
        """Whether the row is about `resource` of `group`, whatever the verbs."""
        if self.verb is not None or group != self.group:
            return False
        return self.resource is None or resource == self.resource or resource.startswith(self.resource + "/")

    def matches(self, group: str, resource: str, verbs: set[str]) -> bool:
        if self.verb is not None:
            return self.verb in verbs
        return self.names(group, resource) and (self.verbs == ALL or bool(verbs & WRITE_VERBS))

    @property
    def resource_cell(self) -> str:
        if self.verb is not None:
            return f"verb `{self.verb}`"
        return f"{self.kind} (`{self.resource}`)" if self.resource else self.kind

    @property
    def group_cell(self) -> str:
        return "any" if self.group == ANY_GROUP else (f"`{self.group}`" if self.group else "core (`\"\"`)")

    @property
    def verbs_cell(self) -> str:
        if self.verb is not None:
            return f"`{self.verb}`"
        return "every verb" if self.verbs == ALL else "writes (`create`, `update`, `patch`, `delete`, `deletecollection`)"


def _verb(verb: str, why: str, mechanism: str, instead: str, cls: str) -> Row:
    return Row(f"verb {verb}", ANY_GROUP, None, ALL, why, mechanism, instead, verb=verb, cls=cls)


_ASK_ADMIN = classes.ASK_ADMIN
_OWN_KIND = classes.OWN_KIND
_READ_ONLY = classes.READ_ONLY
_DECKHOUSE = classes.DECKHOUSE

POLICY: tuple[Row, ...] = (
    # --- verbs that grant or assume other identities ---
    _verb("escalate", "it grants or assumes other identities: it lets a Role be written with more than its writer has",
          "RBAC escalation check bypass", _ASK_ADMIN, cls="identity"),
    _verb("bind", "it grants or assumes other identities: it binds a Role the binder does not hold",
          "RBAC escalation check bypass", _ASK_ADMIN, cls="identity"),
    _verb("impersonate", "it grants or assumes other identities: it acts as any user, group or ServiceAccount",
          "Impersonate-User headers", _ASK_ADMIN, cls="identity"),
    _verb("approve", "it grants or assumes other identities: it approves certificates for any name",
          "CSR approval for any signer", _ASK_ADMIN, cls="credentials"),
    _verb("sign", "it grants or assumes other identities: it signs client certificates for any user",
          "CSR signing", _ASK_ADMIN, cls="credentials"),
    _verb("attest", "it grants or assumes other identities: it vouches for a signer's trust anchors",
          "ClusterTrustBundle attestation", _ASK_ADMIN, cls="credentials"),
    _verb("use", "it grants or assumes other identities: it uses a policy object that admits privileged pods",
          "PodSecurityPolicy / SecurityContextConstraints use", _ASK_ADMIN, cls="identity"),
    # --- API groups that decide identity or authorisation, extend the API, or are the module's own ---
    Row("the RBAC API group", "rbac.authorization.k8s.io", None, ALL, "RBAC objects grant permissions",
        "Roles and bindings are authority itself", _ASK_ADMIN, cls="identity"),
    Row("the authentication API group", "authentication.k8s.io", None, ALL,
        "token reviews validate other identities' tokens", "TokenReview as a token oracle", _ASK_ADMIN, cls="identity"),
    Row("the authorization API group", "authorization.k8s.io", None, ALL,
        "access reviews disclose other identities' permissions", "SubjectAccessReview reconnaissance", _ASK_ADMIN,
        cls="identity"),
    Row("the certificates API group", "certificates.k8s.io", None, ALL,
        "certificate signing requests can mint client certificates for any user", "CSR for system:masters",
        _ASK_ADMIN, cls="credentials"),
    Row("the admission API group", "admissionregistration.k8s.io", None, ALL,
        "admission webhooks and policies see and change every request", "a mutating webhook sees every Secret",
        _ASK_ADMIN, cls="admission"),
    Row("the apiextensions API group", "apiextensions.k8s.io", None, ALL,
        "CRDs change the API and its conversion webhooks", "a conversion webhook sees every object of a kind",
        "ship your CRDs with your module on both clusters", cls="api"),
    Row("the apiregistration API group", "apiregistration.k8s.io", None, ALL,
        "API services route API groups to arbitrary backends", "an APIService takes over a group's requests",
        _ASK_ADMIN, cls="api"),
    Row("the peering API group", "peering.deckhouse.io", None, ALL,
        "the peering module's own resources control the peering itself", "a peer widening its own access",
        "the administrators of both clusters manage the peering", cls="peering"),
    # --- credentials and shells into workloads (every verb) ---
    Row("Secret", "", "secrets", ALL, "Secrets hold credentials of other identities",
        "a ServiceAccount token or kubeconfig in a Secret", _OWN_KIND, cls="credentials"),
    Row("ServiceAccount token", "", "serviceaccounts/token", ALL, "it mints tokens of ServiceAccounts",
        "TokenRequest for any ServiceAccount", "use your consumer's own projected token", cls="credentials"),
    Row("Node proxy", "", "nodes/proxy", ALL, "it reaches the kubelet API, which runs commands in any pod of the node",
        "kubelet /exec and /run", _ASK_ADMIN, cls="shells"),
    Row("Pod exec", "", "pods/exec", ALL, "it runs commands in pods, with their ServiceAccounts and mounted Secrets",
        "a shell in a pod", _OWN_KIND, cls="shells"),
    Row("Pod attach", "", "pods/attach", ALL, "it attaches to processes in pods", "a shell in a pod", _OWN_KIND,
        cls="shells"),
    Row("Pod port-forward", "", "pods/portforward", ALL, "it reaches ports inside pods past NetworkPolicies",
        "a tunnel past NetworkPolicy", _OWN_KIND, cls="shells"),
    Row("Pod proxy", "", "pods/proxy", ALL, "it proxies requests into pods", "the API server as a proxy", _OWN_KIND,
        cls="shells"),
    Row("Service proxy", "", "services/proxy", ALL, "it proxies requests into services", "the API server as a proxy",
        _OWN_KIND, cls="shells"),
    Row("ephemeral container", "", "pods/ephemeralcontainers", ALL, "an ephemeral container is a shell in the pod",
        "kubectl debug into any pod", _OWN_KIND, cls="shells"),
    Row("Binding", "", "bindings", ALL, "it places pods on any node, past the scheduler and its constraints",
        "pods/binding onto control-plane nodes", "let the scheduler place the pods", cls="scheduling"),
    Row("Pod binding", "", "pods/binding", ALL, "it places pods on any node, past the scheduler and its constraints",
        "pods/binding onto control-plane nodes", "let the scheduler place the pods", cls="scheduling"),
    # --- user-authn, user-authz and module configuration (every verb) ---
    Row("TokenExchangeProvider", "deckhouse.io", "tokenexchangeproviders", ALL,
        "token exchange providers decide which tokens Dex accepts", "a foreign issuer trusted by Dex", _ASK_ADMIN,
        cls="credentials"),
    Row("User", "deckhouse.io", "users", ALL, "user-authn users are identities", "a static user with a password",
        _ASK_ADMIN, cls="identity"),
    Row("Group", "deckhouse.io", "groups", ALL, "user-authn groups decide identities' permissions",
        "joining an administrators' group", _ASK_ADMIN, cls="identity"),
    Row("DexProvider", "deckhouse.io", "dexproviders", ALL, "Dex providers decide which identities log in",
        "an identity provider of the attacker's", _ASK_ADMIN, cls="credentials"),
    Row("DexAuthenticator", "deckhouse.io", "dexauthenticators", ALL, "Dex authenticators decide which identities log in",
        "an OAuth2 client with a redirect of the attacker's", _ASK_ADMIN, cls="credentials"),
    Row("ClusterAuthorizationRule", "deckhouse.io", "clusterauthorizationrules", ALL, "authorization rules grant permissions",
        "user-authz grants cluster-admin", _ASK_ADMIN, cls="identity"),
    Row("AuthorizationRule", "deckhouse.io", "authorizationrules", ALL, "authorization rules grant permissions",
        "user-authz grants in a namespace", _ASK_ADMIN, cls="identity"),
    Row("ModuleConfig", "deckhouse.io", "moduleconfigs", ALL, "module configuration can turn off the cluster's protections",
        "disabling admission-policy-engine or user-authz", _DECKHOUSE, cls="configuration"),
    # --- Deckhouse cluster management ---
    Row("NodeGroupConfiguration", "deckhouse.io", "nodegroupconfigurations", ALL,
        "its scripts run as root on every node of a group, and reading them discloses what they carry",
        "bashible runs spec.content on the nodes", _DECKHOUSE, cls="machines"),
    Row("NodeGroup", "deckhouse.io", "nodegroups", WRITES,
        "a node group decides the nodes' labels, taints, kubelet settings and how many nodes there are",
        "node-manager applies spec.nodeTemplate and scales", _DECKHOUSE, cls="machines"),
    Row("NodeUser", "deckhouse.io", "nodeusers", WRITES, "it creates Linux users, sudoers too, on every node",
        "node-manager adds SSH keys and sudo on the nodes", _DECKHOUSE, cls="machines"),
    Row("SSHCredentials", "deckhouse.io", "sshcredentials", ALL,
        "they hold private SSH keys and sudo passwords of the cluster's machines",
        "Cluster API Provider Static logs in with them", _DECKHOUSE, cls="credentials"),
    Row("StaticInstance", "deckhouse.io", "staticinstances", WRITES,
        "it makes a machine a node of the cluster with the credentials it names",
        "Cluster API Provider Static bootstraps it", _DECKHOUSE, cls="machines"),
    Row("ModuleSource", "deckhouse.io", "modulesources", ALL,
        "it decides where Deckhouse pulls module code from, and holds the registry credentials",
        "a registry of the attacker's runs as a module", _DECKHOUSE, cls="releases"),
    Row("ModuleUpdatePolicy", "deckhouse.io", "moduleupdatepolicies", WRITES,
        "it decides which module releases are deployed, and when, without an administrator",
        "automatic deployment of a new module release", _DECKHOUSE, cls="releases"),
    Row("ModulePullOverride", "deckhouse.io", "modulepulloverrides", WRITES,
        "it deploys a module from any image tag of its source", "a module image of the attacker's choice",
        _DECKHOUSE, cls="releases"),
    Row("ClusterLoggingConfig", "deckhouse.io", "clusterloggingconfigs", WRITES,
        "it ships the logs of every pod, or any file of the nodes, to a destination", "log-shipper reads node files",
        _DECKHOUSE, cls="observability"),
    Row("ClusterLogDestination", "deckhouse.io", "clusterlogdestinations", ALL,
        "it decides where logs go, and holds the destination's credentials", "logs sent to the attacker",
        _DECKHOUSE, cls="observability"),
    # --- identity of workloads and networking (writes) ---
    Row("Namespace", "", "namespaces", WRITES, "a namespace's labels decide its project and Pod Security level",
        "a label moves a namespace into a paired project", _READ_ONLY, cls="tenancy"),
    Row("Project", "deckhouse.io", "projects", WRITES, "projects decide which namespaces are paired",
        "a project of the peer's choosing", _READ_ONLY, cls="tenancy"),
    Row("ProjectTemplate", "deckhouse.io", "projecttemplates", WRITES, "project templates create RBAC in every project",
        "RBAC through a template", _READ_ONLY, cls="tenancy"),
    Row("Node", "", "nodes", WRITES, "a node's labels and taints decide where workloads run, sensitive ones included",
        "labels that attract privileged pods; nodes/status too", _READ_ONLY, cls="machines"),
    Row("PersistentVolume", "", "persistentvolumes", WRITES, "a PersistentVolume can mount any path of a node's file system",
        "a hostPath volume of /", _READ_ONLY, cls="storage"),
    Row("Service", "", "services", WRITES, "a Service's external IPs and load balancer status take over any IP's traffic",
        "CVE-2020-8554", "let the module of this cluster own its Services; " + _READ_ONLY, cls="routing"),
    Row("Pod status", "", "pods/status", WRITES,
        "a pod's IPs in its status become the endpoints of every Service that selects the pod",
        "the EndpointSlice controller takes the addresses from pods/status", _READ_ONLY, cls="routing"),
    Row("Endpoints", "", "endpoints", WRITES, "Endpoints can point a Service at any address, in other namespaces too",
        "CVE-2021-25740", _READ_ONLY, cls="routing"),
    Row("EndpointSlice", "discovery.k8s.io", "endpointslices", WRITES,
        "EndpointSlices can point a Service at any address, in other namespaces too", "CVE-2021-25740", _READ_ONLY,
        cls="routing"),
    # --- scheduling, runtime, API fairness and storage (writes) ---
    Row("PriorityClass", "scheduling.k8s.io", "priorityclasses", WRITES,
        "a priority class lets pods preempt every other workload, system ones included", "preemption", _READ_ONLY,
        cls="scheduling"),
    Row("RuntimeClass", "node.k8s.io", "runtimeclasses", WRITES,
        "a runtime class picks the container runtime handler of pods, and so their isolation",
        "an unsandboxed handler", _READ_ONLY, cls="scheduling"),
    Row("FlowSchema", "flowcontrol.apiserver.k8s.io", "flowschemas", WRITES,
        "flow schemas decide whose requests the API server serves first", "API Priority and Fairness: starving others",
        _READ_ONLY, cls="api-server"),
    Row("PriorityLevelConfiguration", "flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations", WRITES,
        "priority levels decide how much of the API server each flow gets",
        "API Priority and Fairness: starving others", _READ_ONLY, cls="api-server"),
    Row("StorageClass", "storage.k8s.io", "storageclasses", WRITES,
        "a storage class passes any parameters to a provisioner that runs with node privileges",
        "provisioner parameters", _READ_ONLY, cls="storage"),
    Row("VolumeAttachment", "storage.k8s.io", "volumeattachments", WRITES,
        "it attaches any volume to any node", "a volume of another tenant on the attacker's node", _READ_ONLY,
        cls="storage"),
    Row("CSIDriver", "storage.k8s.io", "csidrivers", WRITES,
        "it decides how a CSI driver is called, with pod tokens and pod information included",
        "CSIDriver.tokenRequests sends pods' tokens to the driver", _READ_ONLY, cls="storage"),
    Row("CSINode", "storage.k8s.io", "csinodes", WRITES, "it tells the scheduler which drivers a node has",
        "volume scheduling", _READ_ONLY, cls="storage"),
    Row("CSIStorageCapacity", "storage.k8s.io", "csistoragecapacities", WRITES,
        "it tells the scheduler where storage is left", "volume scheduling", _READ_ONLY, cls="storage"),
)

#: nonResourceURLs a capability may grant, with `get` only. Kubernetes grants each of them to every authenticated
#: identity already (the system:discovery and system:public-info-viewer ClusterRoles), so a rule naming them
#: discloses nothing new; a controller needs discovery (/api, /apis) for its REST mapping.
SHARED_URLS = {
    "/version": "the API server's version",
    "/healthz": "the API server's health",
    "/readyz": "the API server's readiness",
    "/livez": "the API server's liveness",
    "/api": "discovery of the core group",
    "/apis": "discovery of the API groups",
}
SHARED_URL_VERBS = frozenset({"get"})

#: nonResourceURLs refused by name, so the page says why; every other one is refused as not shared.
REFUSED_URLS = {
    "/logs": ("it serves the log files of the control-plane node", "kube-apiserver's /logs handler"),
    "/debug/pprof": ("profiles and heap dumps hold tokens and keys, and profiling costs the API server CPU",
                     "Go's net/http/pprof"),
    "/metrics": ("metrics disclose every kind, request and client of the API server, and scraping is costly",
                 "Prometheus exposition"),
    "/debug/flags/v": ("a PUT raises the API server's log verbosity until it logs request headers", "klog -v"),
}


_ROWS_OF_GROUP: dict[str, list[Row]] = {}
for _row in POLICY:
    if _row.verb is None:
        _ROWS_OF_GROUP.setdefault(_row.group, []).append(_row)


def matching(group: str, resource: str, verbs: set[str]) -> list[Row]:
    """The rows that refuse `verbs` on `resource` of `group`, most specific first (a resource row before its group)."""
    rows = [row for row in _ROWS_OF_GROUP.get(group, ()) if row.matches(group, resource, verbs)]
    return sorted(rows, key=lambda row: row.resource is None)


@dataclass(frozen=True)
class Refusal:
    """Why a rule may not grant some verbs on a resource: a row of POLICY (`row`), or its class alone."""

    cls: classes.Class
    row: Row | None = None


def _depth(resource: str | None) -> int:
    return 0 if resource is None else resource.count("/") + 1


def class_of(group: str, resource: str) -> tuple[classes.Class, Row | None]:
    """The class that decides `resource` of `group`, with the row that names it (None: the class alone): the most
    specific of its entry in capability_classes.CLASSIFIED and the rows naming it; `unknown` when neither does."""
    rows = [row for row in _ROWS_OF_GROUP.get(group, ()) if row.names(group, resource)]
    row = max(rows, key=lambda r: _depth(r.resource), default=None)
    found = classes.entry(group, resource)
    if found is not None and (row is None or _depth(found[0]) > _depth(row.resource)):
        return found[1], None
    if row is not None:
        return classes.CLASSES[row.cls], row
    return classes.CLASSES["unknown"], None


def scope_of(group: str, resource: str, namespaced=None) -> str | None:
    """served.NAMESPACED or served.CLUSTER: from the tables of what the clusters serve, else from `namespaced`
    (discovery: (group, resource) -> True, False or None), else None."""
    scope = served.scope(group, resource)
    if scope is None and namespaced is not None:
        answer = namespaced(group, resource.split("/", 1)[0])
        scope = None if answer is None else (served.NAMESPACED if answer else served.CLUSTER)
    return scope


def refusals(group: str, resource: str, verbs: set[str], namespaced=None) -> list[Refusal]:
    """Why `verbs` on `resource` of `group` may not be granted; empty when they may. The rows refusing them, then
    the resource's class when it refuses them too and no row of that class did; a write on a cluster-scoped
    object that nothing else refuses is refused as `cluster-wide`."""
    out = [Refusal(classes.CLASSES[row.cls], row) for row in matching(group, resource, verbs)]
    cls, _ = class_of(group, resource)
    if cls.refused(verbs, WRITE_VERBS) and all(r.cls is not cls for r in out):
        out.append(Refusal(cls))
    if not out and verbs & WRITE_VERBS and scope_of(group, resource, namespaced) == served.CLUSTER:
        out.append(Refusal(classes.CLASSES["cluster-wide"]))
    return out


def url_refusal(url: str, verbs: set[str]) -> str | None:
    """Why a rule may not grant `verbs` on the nonResourceURL `url`, or None when it may."""
    shared = ", ".join(SHARED_URLS)
    if url in SHARED_URLS:
        extra = sorted(verbs - SHARED_URL_VERBS)
        if not extra:
            return None
        return f"grants {', '.join(extra)} on {url}; only get is shared on nonResourceURLs. Grant get only"
    for prefix, (why, mechanism) in REFUSED_URLS.items():
        if url == prefix or url.startswith(prefix.rstrip("/") + "/"):
            return f"names the nonResourceURL {url}: {why} ({mechanism}); only get on {shared} is shared"
    return (f"names the nonResourceURL {url}, which a capability may not grant; only get on {shared} is shared. "
            "Discovery and OpenAPI below /api, /apis and /openapi need no rule (every authenticated identity may "
            "read them); for anything else grant the resources the controller needs")


def markdown_table() -> str:
    """The table of docs/capability-policy.md."""
    lines = ["| kind / resource | group | class | verbs | why refused | CVE or mechanism | instead |",
             "|---|---|---|---|---|---|---|"]
    for row in POLICY:
        lines.append(f"| {row.resource_cell} | {row.group_cell} | `{row.cls}` | {row.verbs_cell} | {row.why} "
                     f"| {row.mechanism} | {row.instead} |")
    for url, (why, mechanism) in REFUSED_URLS.items():
        lines.append(f"| nonResourceURL `{url}` (and below it) | none | none | every verb | {why} | {mechanism} "
                     f"| grant the resources the controller needs |")
    lines.append("| any other nonResourceURL | none | none | every verb | it is not on the shared list | "
                 "the API server's own handlers | grant the resources the controller needs |")
    lines.append("| a shared nonResourceURL | none | none | every verb but `get` | only reading is shared | "
                 "the API server's own handlers | grant `get` only |")
    return "\n".join(lines) + "\n"


_READS = frozenset({"get", "list", "watch"})


def _verdict_cell(found: list[Refusal]) -> str:
    return "refused (" + ", ".join(r.row.kind if r.row else r.cls.name for r in found) + ")" if found else "allowed"


def resources_table() -> str:
    """The verdict on reading and on writing every resource kube-apiserver and Deckhouse serve (served.ALL)."""
    lines = ["| group | resource | scope | class | reads | writes | source |", "|---|---|---|---|---|---|---|"]
    for s in served.ALL:
        cls, _ = class_of(s.group, s.resource)
        reads = _verdict_cell(refusals(s.group, s.resource, set(_READS)))
        writes = _verdict_cell(refusals(s.group, s.resource, set(WRITE_VERBS)))
        group = s.group or '""'
        lines.append(f"| `{group}` | `{s.resource}` | {s.scope or 'not read'} | `{cls.name}` | {reads} "
                     f"| {writes} | {s.source} |")
    return "\n".join(lines) + "\n"


def shared_urls_table() -> str:
    """The table of the nonResourceURLs a capability may grant, for docs/capability-policy.md."""
    lines = ["| nonResourceURL | verbs | what it is |", "|---|---|---|"]
    lines += [f"| `{url}` | `get` | {what} |" for url, what in SHARED_URLS.items()]
    return "\n".join(lines) + "\n"
