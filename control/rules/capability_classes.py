"""The classes of the capability policy: what a rule lets a peer do, and the verdict that follows from it.

Every resource a rule may name belongs to a class (routing traffic, credentials, admission, releases, machines,
storage, identity, ...), and the class decides: every verb refused, the writes refused, or allowed. `CLASSIFIED`
says the class of each resource, API group by API group; a resource without an entry of its own takes the entry
of the resource it is a subresource of (`ingresses/status` that of `ingresses`), else its group's (`*`), so a
kind that appears later in a classified group (a new cert-manager issuer, a new Gatekeeper mutator) has its
class before anyone names it. The resources with a reason of their own (a CVE, a mechanism) are the rows of
control/rules/capability_policy.py, each in one of these classes too.

Two classes are not a resource's entry: `unknown`, for a kind no table knows, and `cluster-wide`, for a write
on a cluster-scoped object that no other class refuses (see capability_policy.refusals).
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = "all"
WRITES = "writes"
NONE = "none"

ASK_ADMIN = "keep it with this cluster's administrators; a peer's module never holds it"
OWN_KIND = "declare a resource of your module's own API group and let your controller on the peer act on it"
READ_ONLY = "grant get, list and watch only"
DECKHOUSE = "cluster management stays with this cluster's administrators and Deckhouse; grant a peer none of it"


@dataclass(frozen=True)
class Class:
    """A class of resources: what a rule on them lets a peer do, what is refused (`refuses`) and why."""

    name: str
    refuses: str  # ALL, WRITES or NONE
    does: str  # what a rule on the class lets a peer do
    why: str
    instead: str

    def refused(self, verbs: set[str], write_verbs: frozenset[str]) -> bool:
        return self.refuses == ALL or (self.refuses == WRITES and bool(verbs & write_verbs))

    @property
    def verdict_cell(self) -> str:
        return {ALL: "refused: every verb", WRITES: "refused: writes; reads allowed", NONE: "allowed"}[self.refuses]


CLASSES: dict[str, Class] = {c.name: c for c in (
    Class("identity", ALL, "grant permissions, or decide who is who",
          "RBAC objects, user-authn users and groups, user-authz rules and project role bindings decide who may "
          "do what, and mesh federations which foreign workloads are trusted; a peer holding one widens its own "
          "access", ASK_ADMIN),
    Class("credentials", ALL, "mint, approve or hold credentials",
          "certificates and their issuers, token and signing requests, Dex clients and providers, SSH keys and "
          "the objects that carry passwords or tokens are other identities' credentials; reading one is holding "
          "it", ASK_ADMIN),
    Class("admission", ALL, "decide what the cluster admits",
          "admission webhooks and policies, Gatekeeper's templates, constraints and mutations, signature "
          "verification and Deckhouse's security policies see, change or refuse every tenant's requests",
          ASK_ADMIN),
    Class("api", ALL, "change the Kubernetes API",
          "CRDs and API services change what the API serves and who answers for it",
          "ship your CRDs with your module on both clusters"),
    Class("api-server", WRITES, "change how the API server serves and stores requests",
          "flow control, storage versions and storage migrations decide whose requests the API server serves "
          "first and how it stores everyone's objects", READ_ONLY),
    Class("peering", ALL, "change the peering itself",
          "the peering module's own resources decide what each peer may do", "the administrators of both "
          "clusters manage the peering"),
    Class("configuration", ALL, "configure Deckhouse and its control plane",
          "module and control-plane configuration can turn off the cluster's protections, and carries settings "
          "with secrets in them", DECKHOUSE),
    Class("releases", WRITES, "decide which code Deckhouse deploys",
          "module and Deckhouse releases, their sources, packages, repositories, update policies and pull "
          "overrides decide which code runs with Deckhouse's privileges, from where and when; approving a "
          "release is an annotation, so a write", DECKHOUSE),
    Class("machines", WRITES, "decide which machines are nodes and what runs on them",
          "nodes, node groups, instances, static instances, machine classes and Cluster API objects decide "
          "which machines join the cluster, with which labels and taints, and what runs on them as root; "
          "deleting an Instance deletes its machine", DECKHOUSE),
    Class("shells", ALL, "run code inside pods and nodes",
          "exec, attach, port-forward, proxies and ephemeral containers reach inside workloads past admission, "
          "with their ServiceAccounts and mounted Secrets", OWN_KIND),
    Class("scheduling", WRITES, "decide where, before whom and on which devices workloads run",
          "bindings, priority and runtime classes, devices and descheduling place workloads and decide their "
          "isolation past the scheduler's and the administrators' choices", READ_ONLY),
    Class("routing", WRITES, "route traffic",
          "Services, endpoints, Ingresses, Gateway API routes, ingress controllers, network policies, meshes "
          "and load balancers decide which address answers for which name and what may reach what; a peer "
          "writing them takes over or opens traffic, other tenants' too", READ_ONLY),
    Class("storage", WRITES, "reach storage beyond the tenant's own",
          "persistent volumes, storage, snapshot and volume attribute classes, snapshot contents and CSI objects "
          "reach the nodes' disks and other tenants' data", READ_ONLY),
    Class("tenancy", WRITES, "decide which namespaces are paired and what bounds them",
          "namespaces, projects and their templates, project namespaces, quotas and limit ranges decide a "
          "namespace's project, its Pod Security level and its bounds", READ_ONLY),
    Class("observability", WRITES, "steer monitoring, logging and auditing",
          "monitors, alerts, metrics, log and audit configs make the cluster's Prometheus, log shippers and "
          "auditors (which read every tenant's data with their own tokens) scrape, keep or send data where the "
          "writer says, or stop looking", READ_ONLY),
    Class("platform", WRITES, "manage the platform",
          "licenses, retention keepers, workspaces and the installation of meshes are Deckhouse's management of "
          "the cluster", DECKHOUSE),
    Class("workloads", NONE, "run and configure workloads in the paired namespaces",
          "pods and their controllers, ConfigMaps, ServiceAccounts, claims, leases, events and autoscalers act "
          "in the namespaces the grants are in and nowhere else", "nothing to do: it is allowed"),
    Class("cluster-state", NONE, "read the state of the cluster's components",
          "component statuses are read-only and hold no credentials (being cluster-scoped, their writes are "
          "`cluster-wide`)", "nothing to do: reading is allowed"),
    Class("unknown", NONE, "name a kind no table of the policy knows",
          "such a kind (your module's own, most likely) is granted only in the paired projects' namespaces: a "
          "Role there reaches those namespaces and nothing else; when it is cluster-scoped, `cluster-wide` "
          "refuses its writes", "nothing to do: it is allowed in namespaces"),
    Class("cluster-wide", WRITES, "write a cluster-scoped object",
          "a cluster-scoped object is one for the whole cluster, shared by every tenant: writing one reaches "
          "beyond the paired projects, and no class of the policy allows that",
          "grant get, list and watch only, or make your kind namespaced"),
)}

#: group, resource (`*`: every resource of the group) and class. Groups and resources that have a row of their
#: own in capability_policy.POLICY are not repeated here. The core group is `""`.
CLASSIFIED_TABLE = """
""                               componentstatuses                  cluster-state
""                               configmaps                         workloads
""                               events                             workloads
""                               limitranges                        tenancy
""                               persistentvolumeclaims             workloads
""                               pods                               workloads
""                               podtemplates                       workloads
""                               replicationcontrollers             workloads
""                               resourcequotas                     tenancy
""                               serviceaccounts                    workloads
apps                             *                                  workloads
autoscaling                      *                                  workloads
batch                            *                                  workloads
coordination.k8s.io              *                                  workloads
discovery.k8s.io                 *                                  routing
events.k8s.io                    *                                  workloads
flowcontrol.apiserver.k8s.io     *                                  api-server
internal.apiserver.k8s.io        *                                  api-server
lifecycle.k8s.io                 *                                  workloads
networking.k8s.io                *                                  routing
node.k8s.io                      *                                  scheduling
policy                           *                                  workloads
resource.k8s.io                  *                                  scheduling
scheduling.k8s.io                *                                  scheduling
storage.k8s.io                   *                                  storage
storagemigration.k8s.io          *                                  api-server
gateway.networking.k8s.io        *                                  routing
gateway.networking.x-k8s.io      *                                  routing
acme.cert-manager.io             *                                  credentials
cert-manager.io                  *                                  credentials
addons.cluster.x-k8s.io          *                                  machines
bootstrap.cluster.x-k8s.io       *                                  machines
cluster.x-k8s.io                 *                                  machines
controlplane.cluster.x-k8s.io    *                                  machines
infrastructure.cluster.x-k8s.io  *                                  machines
infrastructure.cluster.x-k8s.io  staticinstancecredentials          credentials
ipam.cluster.x-k8s.io            *                                  machines
runtime.cluster.x-k8s.io         *                                  machines
machine.sapcloud.io              *                                  machines
nfd.k8s-sigs.io                  *                                  machines
apps.kruise.io                   *                                  workloads
autoscaling.k8s.io               *                                  workloads
aquasecurity.github.io           *                                  observability
aquasecurity.github.io           exposedsecretreports               credentials
argoproj.io                      *                                  releases
cilium.io                        *                                  routing
k8s.cni.cncf.io                  *                                  routing
metallb.io                       *                                  routing
config.gatekeeper.sh             *                                  admission
constraints.gatekeeper.sh        *                                  admission
expansion.gatekeeper.sh          *                                  admission
externaldata.gatekeeper.sh       *                                  admission
mutations.gatekeeper.sh          *                                  admission
status.gatekeeper.sh             *                                  admission
syncset.gatekeeper.sh            *                                  admission
templates.gatekeeper.sh          *                                  admission
config.ratify.deislabs.io        *                                  admission
dex.coreos.com                   *                                  credentials
extensions.istio.io              *                                  routing
install.istio.io                 *                                  platform
networking.istio.io              *                                  routing
security.istio.io                *                                  routing
telemetry.istio.io               *                                  observability
sailoperator.io                  *                                  platform
monitoring.coreos.com            *                                  observability
snapshot.storage.k8s.io          *                                  storage
snapshot.storage.k8s.io          volumesnapshots                    workloads
snapshot.storage.k8s.io          volumesnapshots/status             storage
control-plane.deckhouse.io       *                                  configuration
internal.deckhouse.io            *                                  machines
internal.deckhouse.io            nodeconfigs                        credentials
internal.network.deckhouse.io    *                                  routing
multitenancy.deckhouse.io        *                                  tenancy
network.deckhouse.io             *                                  routing
projects.deckhouse.io            *                                  tenancy
deckhouse.io                     applicationpackages                releases
deckhouse.io                     applicationpackageversions         releases
deckhouse.io                     applications                       releases
deckhouse.io                     clusterapplicationpackages         releases
deckhouse.io                     clusterapplicationpackageversions  releases
deckhouse.io                     clusterapplications                releases
deckhouse.io                     deckhousereleases                  releases
deckhouse.io                     moduledocumentations               releases
deckhouse.io                     modulepackages                     releases
deckhouse.io                     modulepackageversions              releases
deckhouse.io                     modulereleases                     releases
deckhouse.io                     modules                            releases
deckhouse.io                     packagerepositories                releases
deckhouse.io                     packagerepositoryoperations        releases
deckhouse.io                     modulesettings                     configuration
deckhouse.io                     awsinstanceclasses                 machines
deckhouse.io                     azureinstanceclasses               machines
deckhouse.io                     dynamixinstanceclasses             machines
deckhouse.io                     gcpinstanceclasses                 machines
deckhouse.io                     huaweicloudinstanceclasses         machines
deckhouse.io                     openstackinstanceclasses           machines
deckhouse.io                     vcdinstanceclasses                 machines
deckhouse.io                     vsphereinstanceclasses             machines
deckhouse.io                     yandexinstanceclasses              machines
deckhouse.io                     zvirtinstanceclasses               machines
deckhouse.io                     containerdintegritypolicies        machines
deckhouse.io                     instanceclaims                     machines
deckhouse.io                     instances                          machines
deckhouse.io                     instancetypescatalogs              machines
deckhouse.io                     nodeextensionrequests              machines
deckhouse.io                     nodeoperations                     machines
deckhouse.io                     nodestaticpodrequests              machines
deckhouse.io                     clusterprojectrolebindings         identity
deckhouse.io                     istiofederations                   identity
deckhouse.io                     istiomulticlusters                 identity
deckhouse.io                     projectrolebindings                identity
deckhouse.io                     useraccounts                       identity
deckhouse.io                     useractions                        identity
deckhouse.io                     useroperations                     identity
deckhouse.io                     dexclients                         credentials
deckhouse.io                     dexproviderchecks                  credentials
deckhouse.io                     grafanaadditionaldatasources       credentials
deckhouse.io                     grafanaalertschannels              credentials
deckhouse.io                     prometheusremotewrites             credentials
deckhouse.io                     upmeterremotewrites                credentials
deckhouse.io                     kubeschedulerwebhookconfigurations admission
deckhouse.io                     namespacedoperationpolicies        admission
deckhouse.io                     namespacedsecuritypolicies         admission
deckhouse.io                     operationpolicies                  admission
deckhouse.io                     securitypolicies                   admission
deckhouse.io                     securitypolicyexceptions           admission
deckhouse.io                     egressistiocontrollers             routing
deckhouse.io                     ingressistiocontrollers            routing
deckhouse.io                     ingressnginxcontrollers            routing
deckhouse.io                     keepalivedinstances                routing
deckhouse.io                     cephcsidriver                      storage
deckhouse.io                     localpathprovisioners              storage
deckhouse.io                     deschedulers                       scheduling
deckhouse.io                     projectnamespaces                  tenancy
deckhouse.io                     workspaces                         tenancy
deckhouse.io                     clusteralerts                      observability
deckhouse.io                     clusterdaemonsetmetrics            observability
deckhouse.io                     clusterdeploymentmetrics           observability
deckhouse.io                     clusteringressmetrics              observability
deckhouse.io                     clusterpodmetrics                  observability
deckhouse.io                     clusterservicemetrics              observability
deckhouse.io                     clusterstatefulsetmetrics          observability
deckhouse.io                     customalertmanagers                observability
deckhouse.io                     customprometheusrules              observability
deckhouse.io                     daemonsetmetrics                   observability
deckhouse.io                     deploymentmetrics                  observability
deckhouse.io                     downtimes                          observability
deckhouse.io                     falcoauditrules                    observability
deckhouse.io                     grafanadashboarddefinitions        observability
deckhouse.io                     ingressmetrics                     observability
deckhouse.io                     namespacemetrics                   observability
deckhouse.io                     podloggingconfigs                  observability
deckhouse.io                     podmetrics                         observability
deckhouse.io                     servicemetrics                     observability
deckhouse.io                     statefulsetmetrics                 observability
deckhouse.io                     upmeterhookprobes                  observability
deckhouse.io                     clusterlicenses                    platform
deckhouse.io                     effectivelicenses                  platform
deckhouse.io                     objectkeepers                      platform
deckhouse.io                     retainers                          platform
deckhouse.io                     testcrds                           platform
"""


def _parse(text: str) -> dict[str, dict[str | None, Class]]:
    out: dict[str, dict[str | None, Class]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        cells = line.split()
        if not cells:
            continue
        if len(cells) != 3 or cells[2] not in CLASSES or cells[2] in ("unknown", "cluster-wide"):
            raise ValueError(f"CLASSIFIED_TABLE line {number}: {line.strip()!r} is not `group resource|* class` "
                             f"with a class of {', '.join(CLASSES)}")
        group = "" if cells[0] == '""' else cells[0]
        resource = None if cells[1] == "*" else cells[1]
        if resource in out.setdefault(group, {}):
            raise ValueError(f"CLASSIFIED_TABLE line {number}: {cells[0]} {cells[1]} is listed twice")
        out[group][resource] = CLASSES[cells[2]]
    return out


CLASSIFIED = _parse(CLASSIFIED_TABLE)


def entry(group: str, resource: str) -> tuple[str | None, Class] | None:
    """The entry of CLASSIFIED that decides `resource` of `group`: (the resource it names or None for the
    group's, its class), the most specific first (`pods/status`, then `pods`, then the group); None: no entry."""
    entries = CLASSIFIED.get(group) or {}
    name = resource
    while name:
        if name in entries:
            return name, entries[name]
        name = name.rpartition("/")[0]
    return (None, entries[None]) if None in entries else None


def classes_table() -> str:
    """The table of the classes, for docs/capability-policy.md and `peering capability-policy`."""
    lines = ["| class | what a rule lets a peer do | verdict | why | instead |", "|---|---|---|---|---|"]
    lines += [f"| `{c.name}` | {c.does} | {c.verdict_cell} | {c.why} | {c.instead} |" for c in CLASSES.values()]
    return "\n".join(lines) + "\n"
