"""The resources kube-apiserver serves, as data: every group, resource and subresource of its discovery.

Where it comes from: the discovery (`/api/v1`, `/apis` and every version of every group) of the kube-apiserver
v1.37.2 that lab/real builds, started with lab/real's runner and its Deckhouse-like flags. tests/control/rules/
test_policy_coverage.py starts it again and fails when its discovery and this table differ. Rows marked
`all-apis` are served only with `--runtime-config=api/all=true` and every alpha and beta feature gate on (read
once from the same binary started so): alpha and beta APIs a cluster may turn on.
A row is `group resource scope`, `""` for the core group; a subresource has the scope of its resource.
"""

VERSION = "v1.37.2"

TABLE = """
""                             bindings                                 Namespaced
""                             componentstatuses                        Cluster
""                             configmaps                               Namespaced
""                             endpoints                                Namespaced
""                             events                                   Namespaced
""                             limitranges                              Namespaced
""                             namespaces                               Cluster
""                             namespaces/finalize                      Cluster
""                             namespaces/status                        Cluster
""                             nodes                                    Cluster
""                             nodes/proxy                              Cluster
""                             nodes/status                             Cluster
""                             persistentvolumeclaims                   Namespaced
""                             persistentvolumeclaims/status            Namespaced
""                             persistentvolumes                        Cluster
""                             persistentvolumes/status                 Cluster
""                             pods                                     Namespaced
""                             pods/attach                              Namespaced
""                             pods/binding                             Namespaced
""                             pods/ephemeralcontainers                 Namespaced
""                             pods/eviction                            Namespaced
""                             pods/exec                                Namespaced
""                             pods/log                                 Namespaced
""                             pods/portforward                         Namespaced
""                             pods/proxy                               Namespaced
""                             pods/resize                              Namespaced
""                             pods/status                              Namespaced
""                             podtemplates                             Namespaced
""                             replicationcontrollers                   Namespaced
""                             replicationcontrollers/scale             Namespaced
""                             replicationcontrollers/status            Namespaced
""                             resourcequotas                           Namespaced
""                             resourcequotas/status                    Namespaced
""                             secrets                                  Namespaced
""                             serviceaccounts                          Namespaced
""                             serviceaccounts/token                    Namespaced
""                             services                                 Namespaced
""                             services/proxy                           Namespaced
""                             services/status                          Namespaced
admissionregistration.k8s.io   mutatingadmissionpolicies                Cluster
admissionregistration.k8s.io   mutatingadmissionpolicybindings          Cluster
admissionregistration.k8s.io   mutatingwebhookconfigurations            Cluster
admissionregistration.k8s.io   validatingadmissionpolicies              Cluster
admissionregistration.k8s.io   validatingadmissionpolicies/status       Cluster
admissionregistration.k8s.io   validatingadmissionpolicybindings        Cluster
admissionregistration.k8s.io   validatingwebhookconfigurations          Cluster
apiextensions.k8s.io           customresourcedefinitions                Cluster
apiextensions.k8s.io           customresourcedefinitions/status         Cluster
apiregistration.k8s.io         apiservices                              Cluster
apiregistration.k8s.io         apiservices/status                       Cluster
apps                           controllerrevisions                      Namespaced
apps                           daemonsets                               Namespaced
apps                           daemonsets/status                        Namespaced
apps                           deployments                              Namespaced
apps                           deployments/scale                        Namespaced
apps                           deployments/status                       Namespaced
apps                           replicasets                              Namespaced
apps                           replicasets/scale                        Namespaced
apps                           replicasets/status                       Namespaced
apps                           statefulsets                             Namespaced
apps                           statefulsets/scale                       Namespaced
apps                           statefulsets/status                      Namespaced
authentication.k8s.io          selfsubjectreviews                       Cluster
authentication.k8s.io          tokenreviews                             Cluster
authorization.k8s.io           localsubjectaccessreviews                Namespaced
authorization.k8s.io           selfsubjectaccessreviews                 Cluster
authorization.k8s.io           selfsubjectrulesreviews                  Cluster
authorization.k8s.io           subjectaccessreviews                     Cluster
autoscaling                    horizontalpodautoscalers                 Namespaced
autoscaling                    horizontalpodautoscalers/status          Namespaced
batch                          cronjobs                                 Namespaced
batch                          cronjobs/status                          Namespaced
batch                          jobs                                     Namespaced
batch                          jobs/status                              Namespaced
certificates.k8s.io            certificatesigningrequests               Cluster
certificates.k8s.io            certificatesigningrequests/approval      Cluster
certificates.k8s.io            certificatesigningrequests/status        Cluster
certificates.k8s.io            clustertrustbundles                      Cluster
certificates.k8s.io            podcertificaterequests                   Namespaced
certificates.k8s.io            podcertificaterequests/status            Namespaced
coordination.k8s.io            leasecandidates                          Namespaced all-apis
coordination.k8s.io            leases                                   Namespaced
discovery.k8s.io               endpointslices                           Namespaced
events.k8s.io                  events                                   Namespaced
flowcontrol.apiserver.k8s.io   flowschemas                              Cluster
flowcontrol.apiserver.k8s.io   flowschemas/status                       Cluster
flowcontrol.apiserver.k8s.io   prioritylevelconfigurations              Cluster
flowcontrol.apiserver.k8s.io   prioritylevelconfigurations/status       Cluster
internal.apiserver.k8s.io      storageversions                          Cluster all-apis
internal.apiserver.k8s.io      storageversions/status                   Cluster all-apis
lifecycle.k8s.io               evictionrequests                         Namespaced all-apis
lifecycle.k8s.io               evictionrequests/status                  Namespaced all-apis
lifecycle.k8s.io               evictions                                Namespaced all-apis
lifecycle.k8s.io               evictions/status                         Namespaced all-apis
networking.k8s.io              ingressclasses                           Cluster
networking.k8s.io              ingresses                                Namespaced
networking.k8s.io              ingresses/status                         Namespaced
networking.k8s.io              ipaddresses                              Cluster
networking.k8s.io              networkpolicies                          Namespaced
networking.k8s.io              servicecidrs                             Cluster
networking.k8s.io              servicecidrs/status                      Cluster
node.k8s.io                    runtimeclasses                           Cluster
policy                         poddisruptionbudgets                     Namespaced
policy                         poddisruptionbudgets/status              Namespaced
rbac.authorization.k8s.io      clusterrolebindings                      Cluster
rbac.authorization.k8s.io      clusterroles                             Cluster
rbac.authorization.k8s.io      rolebindings                             Namespaced
rbac.authorization.k8s.io      roles                                    Namespaced
resource.k8s.io                deviceclasses                            Cluster
resource.k8s.io                devicetaintrules                         Cluster
resource.k8s.io                devicetaintrules/status                  Cluster
resource.k8s.io                resourceclaims                           Namespaced
resource.k8s.io                resourceclaims/status                    Namespaced
resource.k8s.io                resourceclaimtemplates                   Namespaced
resource.k8s.io                resourcepoolstatusrequests               Cluster all-apis
resource.k8s.io                resourcepoolstatusrequests/status        Cluster all-apis
resource.k8s.io                resourceslices                           Cluster
scheduling.k8s.io              compositepodgroups                       Namespaced all-apis
scheduling.k8s.io              compositepodgroups/status                Namespaced all-apis
scheduling.k8s.io              podgroups                                Namespaced all-apis
scheduling.k8s.io              podgroups/status                         Namespaced all-apis
scheduling.k8s.io              priorityclasses                          Cluster
scheduling.k8s.io              workloads                                Namespaced all-apis
storage.k8s.io                 csidrivers                               Cluster
storage.k8s.io                 csinodes                                 Cluster
storage.k8s.io                 csinodes/status                          Cluster
storage.k8s.io                 csistoragecapacities                     Namespaced
storage.k8s.io                 storageclasses                           Cluster
storage.k8s.io                 volumeattachments                        Cluster
storage.k8s.io                 volumeattachments/status                 Cluster
storage.k8s.io                 volumeattributesclasses                  Cluster
storagemigration.k8s.io        storageversionmigrations                 Cluster
storagemigration.k8s.io        storageversionmigrations/status          Cluster
"""
