"""The resources a Deckhouse cluster serves beyond Kubernetes' own: the CRDs of deckhouse/deckhouse, as data.

Where it comes from: the `crds/` folders (and `candi/.../openapi/instance_class.yaml`, `candi/openapi/node_group.yaml`)
of deckhouse/deckhouse at commit 30543731e7df (2025-01-04; every CustomResourceDefinition there, parsed), and the
files added to those folders since, read one by one at the commit written after their name (`file@commit`).
A `[folder]` line names the folder of the rows below it. A row is `group resource scope subresources file`:
scope `-` where the file's scope was not read (the capability policy's verdict on such a row does not depend on
its scope, and a test holds it to that), subresources as the CRD declares them (`-`: none, or not read).
The peering module's own CRDs come from charts/peering/crds, and `tokenexchangeproviders` from the contract the
module assumes (lab/apiserver/crds, deckhouse-facts.md §0).

Not recorded: files of those folders whose API group could not be read (the group classes of
control/rules/capability_classes.py cover the Deckhouse groups they are likely in), Deckhouse modules outside
deckhouse/deckhouse (virtualization, sds-*, csi-*), and CRDs a Deckhouse module creates from code.
"""

TABLE = """
[candi/cloud-providers/aws/openapi]
deckhouse.io awsinstanceclasses Cluster - instance_class.yaml
[candi/cloud-providers/azure/openapi]
deckhouse.io azureinstanceclasses Cluster - instance_class.yaml
[candi/cloud-providers/gcp/openapi]
deckhouse.io gcpinstanceclasses Cluster - instance_class.yaml
[candi/cloud-providers/yandex/openapi]
deckhouse.io yandexinstanceclasses Cluster - instance_class.yaml
[charts/peering/crds]
peering.deckhouse.io clusterpeers Cluster status clusterpeer.yaml
peering.deckhouse.io peeringcapabilities Cluster status peeringcapability.yaml
peering.deckhouse.io projectpeers Namespaced status projectpeer.yaml
[deckhouse-controller/crds]
deckhouse.io applicationpackages - - deckhouse.io_applicationpackages.yaml@c7285abc4830
deckhouse.io applicationpackageversions - - deckhouse.io_applicationpackageversions.yaml@1e8b92854826
deckhouse.io applications Namespaced status application.yaml@0a80ddab2fbe
deckhouse.io clusterapplicationpackages - - deckhouse.io_clusterapplicationpackages.yaml@6aee7a2b185b
deckhouse.io clusterapplicationpackageversions - - deckhouse.io_clusterapplicationpackageversions.yaml@c7285abc4830
deckhouse.io clusterapplications Cluster status deckhouse.io_clusterapplications.yaml@c7285abc4830
deckhouse.io clusterlicenses Cluster status clusterlicense.yaml@60bfa44383f0
deckhouse.io deckhousereleases Cluster status deckhouse-release.yaml
deckhouse.io effectivelicenses Cluster - effectivelicense.yaml@22151f56e85d
deckhouse.io moduleconfigs Cluster status module-config.yaml
deckhouse.io moduledocumentations Cluster status module-documentation.yaml
deckhouse.io modulepackages - - deckhouse.io_modulepackages.yaml@bbd6e8a896af
deckhouse.io modulepackageversions - - deckhouse.io_modulepackageversions.yaml@bbd6e8a896af
deckhouse.io modulepulloverrides Cluster status module-pull-override.yaml
deckhouse.io modulereleases Cluster status module-release.yaml
deckhouse.io modules Cluster status module.yaml
deckhouse.io modulesettings Cluster - module-settings.yaml@a0c304742f76
deckhouse.io modulesources Cluster status module-source.yaml
deckhouse.io moduleupdatepolicies Cluster - module-update-policy.yaml
deckhouse.io objectkeepers Cluster status objectkeeper.yaml@3faa73a95b66
deckhouse.io packagerepositories - - deckhouse.io_packagerepositories.yaml@caa6370cd1a2
deckhouse.io packagerepositoryoperations - - deckhouse.io_packagerepositoryoperations.yaml@c6c8009b4101
deckhouse.io retainers Cluster status retainer.yaml@a71ade75df0f
network.deckhouse.io cnimigrations Cluster status cni-migration.yaml@0e186dc84b21
network.deckhouse.io cninodemigrations - - cni-node-migration.yaml@2272b957628d
[ee/candi/cloud-providers/dynamix/openapi]
deckhouse.io dynamixinstanceclasses Cluster - instance_class.yaml
[ee/candi/cloud-providers/huaweicloud/openapi]
deckhouse.io huaweicloudinstanceclasses Cluster - instance_class.yaml
[ee/candi/cloud-providers/openstack/openapi]
deckhouse.io openstackinstanceclasses Cluster - instance_class.yaml
[ee/candi/cloud-providers/vcd/openapi]
deckhouse.io vcdinstanceclasses Cluster - instance_class.yaml
[ee/modules/025-static-routing-manager/crds]
network.deckhouse.io iprulesets Cluster status iprulesets.yaml
network.deckhouse.io routingtables Cluster status routingtables.yaml
[ee/modules/025-static-routing-manager/crds/internal]
internal.network.deckhouse.io sdninternalnodeiprulesets Cluster status sdninternalnodeiprulesets.yaml
internal.network.deckhouse.io sdninternalnoderoutingtables Cluster status sdninternalnoderoutingtables.yaml
[ee/modules/030-cloud-provider-dynamix/crds/external]
infrastructure.cluster.x-k8s.io dynamixclusters Namespaced status dynamixclusters.yaml
infrastructure.cluster.x-k8s.io dynamixmachines Namespaced status dynamixmachines.yaml
infrastructure.cluster.x-k8s.io dynamixmachinetemplates Namespaced - dynamixmachinetemplates.yaml
[ee/modules/030-cloud-provider-huaweicloud/crds/external]
infrastructure.cluster.x-k8s.io huaweicloudclusters Namespaced status huaweicloudclusters.yaml
infrastructure.cluster.x-k8s.io huaweicloudmachines Namespaced status huaweicloudmachines.yaml
infrastructure.cluster.x-k8s.io huaweicloudmachinetemplates Namespaced status huaweicloudmachinetemplates.yaml
[ee/modules/030-cloud-provider-vcd/crds/external]
infrastructure.cluster.x-k8s.io vcdclusters Namespaced status vcdclusters.yaml
infrastructure.cluster.x-k8s.io vcdclustertemplates Namespaced status vcdclustertemplates.yaml
infrastructure.cluster.x-k8s.io vcdmachines Namespaced status vcdmachines.yaml
infrastructure.cluster.x-k8s.io vcdmachinetemplates Namespaced status vcdmachinetemplates.yaml
[ee/modules/110-istio/crds]
deckhouse.io istiofederations Cluster status istiofederation.yaml
deckhouse.io istiomulticlusters Cluster status istiomulticluster.yaml
[ee/modules/450-keepalived/crds]
deckhouse.io keepalivedinstances Cluster - crd.yaml
[ee/modules/500-operator-trivy/crds/native]
aquasecurity.github.io clustercompliancereports Cluster status aquasecurity.github.io_clustercompliancereports.yaml
aquasecurity.github.io clusterconfigauditreports Cluster - aquasecurity.github.io_clusterconfigauditreports.yaml
aquasecurity.github.io clusterinfraassessmentreports Cluster - aquasecurity.github.io_clusterinfraassessmentreports.yaml
aquasecurity.github.io clusterrbacassessmentreports Cluster - aquasecurity.github.io_clusterrbacassessmentreports.yaml
aquasecurity.github.io clustersbomreports Cluster - aquasecurity.github.io_clustersbomreports.yaml
aquasecurity.github.io clustervulnerabilityreports Cluster - aquasecurity.github.io_clustervulnerabilityreports.yaml
aquasecurity.github.io configauditreports Namespaced - aquasecurity.github.io_configauditreports.yaml
aquasecurity.github.io exposedsecretreports Namespaced - aquasecurity.github.io_exposedsecretreports.yaml
aquasecurity.github.io infraassessmentreports Namespaced - aquasecurity.github.io_infraassessmentreports.yaml
aquasecurity.github.io rbacassessmentreports Namespaced - aquasecurity.github.io_rbacassessmentreports.yaml
aquasecurity.github.io sbomreports Namespaced - aquasecurity.github.io_sbomreports.yaml
aquasecurity.github.io vulnerabilityreports Namespaced - aquasecurity.github.io_vulnerabilityreports.yaml
[ee/modules/610-service-with-healthchecks/crds]
network.deckhouse.io servicewithhealthchecks Namespaced status servicewithhealthchecks.yaml
[ee/modules/650-runtime-audit-engine/crds]
deckhouse.io falcoauditrules Cluster - falco-audit-rules.yaml
[ee/se-plus/candi/cloud-providers/vsphere/openapi]
deckhouse.io vsphereinstanceclasses Cluster - instance_class.yaml
[ee/se-plus/candi/cloud-providers/zvirt/openapi]
deckhouse.io zvirtinstanceclasses Cluster - instance_class.yaml
[ee/se-plus/modules/021-cni-cilium/crds]
network.deckhouse.io egressgatewaypolicies Cluster status egressgatewaypolicies.yaml
network.deckhouse.io egressgateways Cluster status egressgateways.yaml
[ee/se-plus/modules/021-cni-cilium/crds/internal]
internal.network.deckhouse.io sdninternalegressgatewayinstances Cluster status egressgatewayinstances.yaml
[ee/se-plus/modules/030-cloud-provider-zvirt/crds/external]
infrastructure.cluster.x-k8s.io zvirtclusters Namespaced status zvirtclusters.yaml
infrastructure.cluster.x-k8s.io zvirtmachines Namespaced status zvirtmachines.yaml
infrastructure.cluster.x-k8s.io zvirtmachinetemplates Namespaced - zvirtmachinetemplates.yaml
[ee/se/modules/380-metallb/crds]
network.deckhouse.io metalloadbalancerbgppeers - - metalloadbalancerbgppeers.yaml@62c8bb4200e1
network.deckhouse.io metalloadbalancerclasses Cluster status metalloadbalancerclasses.yaml
network.deckhouse.io metalloadbalancerconfigurations - - metalloadbalancerconfigurations.yaml@612b02fcbaa0
network.deckhouse.io metalloadbalancerpools - - metalloadbalancerpools.yaml@76cda84ddc25
[ee/se/modules/380-metallb/crds/internal]
internal.network.deckhouse.io sdninternall2lbservices Namespaced status l2lbservices.yaml
[ee/se/modules/380-metallb/crds/native]
metallb.io bfdprofiles Namespaced status bfdprofiles.yaml
metallb.io bgpadvertisements Namespaced status bgpadvertisements.yaml
metallb.io bgppeers Namespaced status bgppeers.yaml
metallb.io communities Namespaced status communities.yaml
metallb.io ipaddresspools Namespaced status ipaddresspools.yaml
metallb.io l2advertisements Namespaced status l2advertisements.yaml
metallb.io servicel2statuses Namespaced status servicel2statuses.yaml
[lab/apiserver/crds]
deckhouse.io tokenexchangeproviders Cluster status tokenexchangeprovider.yaml(assumed)
[modules/000-common/crds]
deckhouse.io testcrds Cluster - test-crd.yaml
[modules/015-admission-policy-engine/crds]
deckhouse.io namespacedoperationpolicies Namespaced - namespaced-operation-policy.yaml@7f9663f23f4b
deckhouse.io namespacedsecuritypolicies - - namespaced-security-policy.yaml@1607d33288d0
deckhouse.io operationpolicies Cluster - operation-policy.yaml
deckhouse.io securitypolicies Cluster status security-policy.yaml
deckhouse.io securitypolicyexceptions Cluster status security-policy-exception.yaml@09fb94e7033b
[modules/015-admission-policy-engine/crds/native]
config.gatekeeper.sh configs Namespaced status config-customresourcedefinition.yaml
expansion.gatekeeper.sh expansiontemplate Cluster status expansiontemplate-customresourcedefinition.yaml
externaldata.gatekeeper.sh providers Cluster - provider-customresourcedefinition.yaml
mutations.gatekeeper.sh assign Cluster status assign-customresourcedefinition.yaml
mutations.gatekeeper.sh assignimage Cluster status assignimage-customresourcedefinition.yaml
mutations.gatekeeper.sh assignmetadata Cluster status assignmetadata-customresourcedefinition.yaml
mutations.gatekeeper.sh modifyset Cluster status modifyset-customresourcedefinition.yaml
status.gatekeeper.sh configpodstatuses Namespaced - configpodstatus-customresourcedefinition.yaml
status.gatekeeper.sh constraintpodstatuses Namespaced - constraintpodstatus-customresourcedefinition.yaml
status.gatekeeper.sh constrainttemplatepodstatuses Namespaced - constrainttemplatepodstatus-customresourcedefinition.yaml
status.gatekeeper.sh expansiontemplatepodstatuses Namespaced - expansiontemplatepodstatus-customresourcedefinition.yaml
status.gatekeeper.sh mutatorpodstatuses Namespaced - mutatorpodstatus-customresourcedefinition.yaml
syncset.gatekeeper.sh syncsets Cluster - syncset-customresourcedefinition.yaml
templates.gatekeeper.sh constrainttemplates Cluster status constrainttemplate-customresourcedefinition.yaml
[modules/015-admission-policy-engine/crds/ratify]
config.ratify.deislabs.io certificatestores Namespaced status certificatestore-customresourcedefinition.yaml
config.ratify.deislabs.io keymanagementproviders Cluster status keymanagementprovider-customresourcedefinition.yaml
config.ratify.deislabs.io namespacedkeymanagementproviders Namespaced status namespacedkeymanagementprovider-customresourcedefinition.yaml
config.ratify.deislabs.io namespacedpolicies Namespaced status namespacedpolicy-customresourcedefinition.yaml
config.ratify.deislabs.io namespacedstores Namespaced status namespacedstore-customresourcedefinition.yaml
config.ratify.deislabs.io namespacedverifiers Namespaced status namespacedverifier-customresourcedefinition.yaml
config.ratify.deislabs.io policies Cluster status policy-customresourcedefinition.yaml
config.ratify.deislabs.io stores Cluster status store-customresourcedefinition.yaml
config.ratify.deislabs.io verifiers Cluster status verifier-customresourcedefinition.yaml
[modules/021-cni-cilium/crds]
cilium.io ciliumbgploadbalancerippools - - ciliumbgploadbalancerippools.yaml@563808f34e9d
cilium.io ciliumegressnatpolicies - - ciliumegressnatpolicies.yaml@0d2dfbb5e9e5
[modules/021-cni-cilium/crds/cilium]
cilium.io ciliumbgpadvertisements - - ciliumbgpadvertisements.yaml@79a4b4afba83
cilium.io ciliumbgpclusterconfigs - - ciliumbgpclusterconfigs.yaml@ed6f061265f8
cilium.io ciliumbgpnodeconfigoverrides - - ciliumbgpnodeconfigoverrides.yaml@e6099344d446
cilium.io ciliumbgpnodeconfigs - - ciliumbgpnodeconfigs.yaml@8091108690ab
cilium.io ciliumbgppeerconfigs - - ciliumbgppeerconfigs.yaml@30ee2be592dc
cilium.io ciliumbgppeeringpolicies Cluster - ciliumbgppeeringpolicies.yaml
cilium.io ciliumcidrgroups Cluster - ciliumcidrgroups.yaml
cilium.io ciliumclusterwideenvoyconfigs Cluster - ciliumclusterwideenvoyconfigs.yaml
cilium.io ciliumclusterwidenetworkpolicies Cluster status ciliumclusterwidenetworkpolicies.yaml
cilium.io ciliumegressgatewaypolicies Cluster - ciliumegressgatewaypolicies.yaml
cilium.io ciliumendpoints Namespaced - ciliumendpoints.yaml
cilium.io ciliumendpointslices Cluster - ciliumendpointslices.yaml
cilium.io ciliumenvoyconfigs Namespaced - ciliumenvoyconfigs.yaml
cilium.io ciliumexternalworkloads Cluster status ciliumexternalworkloads.yaml
cilium.io ciliumidentities Cluster status ciliumidentities.yaml
cilium.io ciliuml2announcementpolicies Cluster status ciliuml2announcementpolicies.yaml
cilium.io ciliumloadbalancerippools Cluster status ciliumloadbalancerippools.yaml
cilium.io ciliumlocalredirectpolicies Namespaced - ciliumlocalredirectpolicies.yaml
cilium.io ciliumnetworkpolicies Namespaced status ciliumnetworkpolicies.yaml
cilium.io ciliumnodeconfigs Namespaced - ciliumnodeconfigs.yaml
cilium.io ciliumnodes Cluster status ciliumnodes.yaml
cilium.io ciliumpodippools Cluster - ciliumpodippools.yaml
[modules/021-cni-cilium/crds/multus]
k8s.cni.cncf.io network-attachment-definitions - - network-attachment-definitions.yaml@73d9b0d1ee19
[modules/031-ceph-csi/crds]
deckhouse.io cephcsidriver Cluster - cephcsi.yaml
[modules/031-local-path-provisioner/crds]
deckhouse.io localpathprovisioners Cluster - local_path_provisioner.yaml
[modules/040-control-plane-manager/crds]
control-plane.deckhouse.io controlplaneconfigurations - - control-plane.deckhouse.io_controlplaneconfigurations.yaml@ce9f134dbdc4
control-plane.deckhouse.io controlplaneoperations - - control-plane.deckhouse.io_controlplaneoperations.yaml@1c16e75d71fe
deckhouse.io kubeschedulerwebhookconfigurations Cluster - kube_scheduler_webhook_configuration.yaml
[modules/040-node-manager/crds]
addons.cluster.x-k8s.io clusterresourcesetbindings - - clusterresourcesetbindings.yaml@c993ce229f59
addons.cluster.x-k8s.io clusterresourcesets - - clusterresourcesets.yaml@c993ce229f59
bootstrap.cluster.x-k8s.io kubeadmconfigs - - kubeadmconfig.yaml@7e63afc3070c
bootstrap.cluster.x-k8s.io kubeadmconfigtemplates - - kubeadmconfigtemplate.yaml@ead34fd12b68
cluster.x-k8s.io clusterclasses - - cluster-class.yaml@9d6d1e319371
cluster.x-k8s.io clusters Namespaced status cluster.yaml
cluster.x-k8s.io machinedeployments Namespaced scale,status machine-deployment.yaml
cluster.x-k8s.io machinedrainrules - - machine-drain-rule.yaml@53241dbdaf68
cluster.x-k8s.io machinehealthchecks Namespaced status machine-health-check.yaml
cluster.x-k8s.io machinepools Namespaced scale,status machine-pools.yaml
cluster.x-k8s.io machines Namespaced status machine.yaml
cluster.x-k8s.io machinesets Namespaced scale,status machine-sets.yaml
controlplane.cluster.x-k8s.io kubeadmcontrolplanes - - kubeadm-control-plane.yaml@4945c8be95b4
deckhouse.io instanceclaims Cluster status instanceclaim.yaml@565adb644094
deckhouse.io instances Cluster status instance.yaml
deckhouse.io instancetypescatalogs Cluster - instancetypescatalogs.yaml
deckhouse.io nodeextensionrequests Cluster status nodeextensionrequest.yaml@24425e6147df
deckhouse.io nodegroupconfigurations Cluster - nodegroupconfiguration.yaml
deckhouse.io nodegroups Cluster status node_group.yaml
deckhouse.io nodestaticpodrequests Cluster status nodestaticpodrequest.yaml@05e4b102c12e
deckhouse.io nodeusers Cluster status nodeuser.yaml
deckhouse.io sshcredentials Cluster - sshcredentials.yaml
deckhouse.io staticinstances Cluster status staticinstance.yaml
infrastructure.cluster.x-k8s.io deckhousecontrolplanes Namespaced status deckhousecontrolplane.yaml
infrastructure.cluster.x-k8s.io staticclusters Namespaced status staticcluster.yaml
infrastructure.cluster.x-k8s.io staticinstancecredentials Namespaced status staticinstancecredentials.yaml@48cefb388341
infrastructure.cluster.x-k8s.io staticmachines Namespaced status staticmachine.yaml
infrastructure.cluster.x-k8s.io staticmachinetemplates Namespaced - staticmachinetemplate.yaml
ipam.cluster.x-k8s.io ipaddressclaims - - ipaddressclaims.yaml@b6c212fe1867
ipam.cluster.x-k8s.io ipaddresses - - ipaddresses.yaml@c993ce229f59
machine.sapcloud.io alicloudmachineclasses Namespaced status mcm.yaml
machine.sapcloud.io awsmachineclasses Namespaced status mcm.yaml
machine.sapcloud.io azuremachineclasses Namespaced status mcm.yaml
machine.sapcloud.io gcpmachineclasses Namespaced status mcm.yaml
machine.sapcloud.io machinedeployments Namespaced status mcm.yaml
machine.sapcloud.io machines Namespaced status mcm.yaml
machine.sapcloud.io machinesets Namespaced status mcm.yaml
machine.sapcloud.io openstackmachineclasses Namespaced status mcm.yaml
machine.sapcloud.io packetmachineclasses Namespaced status mcm.yaml
machine.sapcloud.io vspheremachineclasses Namespaced status mcm.yaml
machine.sapcloud.io yandexmachineclasses Namespaced status mcm.yaml
nfd.k8s-sigs.io nodefeaturegroups - - nfd-api-crds.yaml@3418423796b9
nfd.k8s-sigs.io nodefeaturerules - - nfd-api-crds.yaml@3418423796b9
nfd.k8s-sigs.io nodefeatures - - nfd-api-crds.yaml@3418423796b9
runtime.cluster.x-k8s.io extensionconfigs Cluster status extension-config.yaml
[modules/040-node-manager/templates/rbacv2/manage]
deckhouse.io containerdintegritypolicies - - view.yaml@197a12f82eeb
deckhouse.io nodeoperations - - view.yaml@197a12f82eeb
internal.deckhouse.io nodeconfigs - status view.yaml@197a12f82eeb
[modules/045-snapshot-controller/crds]
snapshot.storage.k8s.io volumesnapshotclasses Cluster - snapshot.storage.k8s.io_volumesnapshotclasses.yaml
snapshot.storage.k8s.io volumesnapshotcontents Cluster status snapshot.storage.k8s.io_volumesnapshotcontents.yaml
snapshot.storage.k8s.io volumesnapshots Namespaced status snapshot.storage.k8s.io_volumesnapshots.yaml
[modules/101-cert-manager/crds]
acme.cert-manager.io challenges Namespaced status crd-challenges.yaml
acme.cert-manager.io orders Namespaced status crd-orders.yaml
cert-manager.io certificaterequests Namespaced status crd-certificaterequests.yaml
cert-manager.io certificates Namespaced status crd-certificates.yaml
cert-manager.io clusterissuers Cluster status crd-clusterissuers.yaml
cert-manager.io issuers Namespaced status crd-issuers.yaml
[modules/110-istio/_crds/istio/1.12]
extensions.istio.io wasmplugins Namespaced status crd-all.gen.yaml
install.istio.io istiooperators Namespaced status crd-operator.yaml
networking.istio.io destinationrules Namespaced status crd-all.gen.yaml
networking.istio.io envoyfilters Namespaced status crd-all.gen.yaml
networking.istio.io gateways Namespaced status crd-all.gen.yaml
networking.istio.io serviceentries Namespaced status crd-all.gen.yaml
networking.istio.io sidecars Namespaced status crd-all.gen.yaml
networking.istio.io virtualservices Namespaced status crd-all.gen.yaml
networking.istio.io workloadentries Namespaced status crd-all.gen.yaml
networking.istio.io workloadgroups Namespaced status crd-all.gen.yaml
security.istio.io authorizationpolicies Namespaced status crd-all.gen.yaml
security.istio.io peerauthentications Namespaced status crd-all.gen.yaml
security.istio.io requestauthentications Namespaced status crd-all.gen.yaml
telemetry.istio.io telemetries Namespaced status crd-all.gen.yaml
[modules/110-istio/_crds/istio/1.13]
networking.istio.io proxyconfigs Namespaced status crd-all.gen.yaml
[modules/110-istio/crds]
deckhouse.io egressistiocontrollers Cluster - egress-istio.yaml@c8f0454c0261
deckhouse.io ingressistiocontrollers Cluster - ingress-istio.yaml
network.deckhouse.io waypointinstances Namespaced - waypoint-instance.yaml@a2cc77f2a04d
[modules/110-istio/crds/istio]
sailoperator.io istiocnis - - istiocnis.sailoperator.io.yaml@3d08b4201b47
[modules/110-istio/crds/vendor]
sailoperator.io istiorevisions - - istiorevisions.sailoperator.io.yaml@73593113baae
sailoperator.io istiorevisiontags - - istiorevisiontags.sailoperator.io.yaml@73593113baae
sailoperator.io istios - - istios.sailoperator.io.yaml@73593113baae
sailoperator.io ztunnels - - ztunnels.sailoperator.io.yaml@73593113baae
[modules/140-user-authz/crds]
deckhouse.io authorizationrules Namespaced - authorizationrule.yaml
deckhouse.io clusterauthorizationrules Cluster - clusterauthorizationrule.yaml
[modules/150-user-authn/crds]
deckhouse.io dexauthenticators Namespaced - dex-authenticator.yaml
deckhouse.io dexclients Namespaced - dex-client.yaml
deckhouse.io dexproviderchecks Cluster status dex-provider-check.yaml@d196a6d458af
deckhouse.io dexproviders Cluster - dex-provider.yaml
deckhouse.io groups Cluster status group.yaml
deckhouse.io useraccounts Cluster status user-account.yaml@4e823fb0aa03
deckhouse.io useractions Cluster status user-action.yaml@0bc882b7b83b
deckhouse.io useroperations Cluster status user-operation.yaml@0e96c32b6729
deckhouse.io users Cluster status user.yaml
dex.coreos.com connectors Namespaced - dex.yaml
dex.coreos.com oauth2clients Namespaced - dex.yaml
dex.coreos.com passwords Namespaced - dex.yaml
[modules/150-user-authn/crds/external]
dex.coreos.com offlinesessionses - - offlinesessionses.yaml@808eed5be0f8
[modules/160-multitenancy-manager/crds]
deckhouse.io clusterprojectrolebindings Cluster status clusterprojectrolebindings.yaml@4acb58ac2b39
deckhouse.io projectnamespaces Namespaced status projectnamespaces.yaml@78b86b462815
deckhouse.io projectrolebindings Namespaced status projectrolebindings.yaml@4acb58ac2b39
deckhouse.io projects Cluster status projects.yaml
deckhouse.io projecttemplates Cluster status projecttemplate.yaml
deckhouse.io workspaces Namespaced status workspaces.yaml@6c08176c441c
multitenancy.deckhouse.io availableclusterresources - - multitenancy.deckhouse.io_availableclusterresources.yaml@a85c7f3f8e4b
multitenancy.deckhouse.io clusterresourcegrantpolicies - - multitenancy.deckhouse.io_clusterresourcegrantpolicies.yaml@a85c7f3f8e4b
multitenancy.deckhouse.io grantableclusterresourcedefinitions - - multitenancy.deckhouse.io_grantableclusterresourcedefinitions.yaml@89cc8fa8834d
multitenancy.deckhouse.io grantableclusterresourcereferences - - multitenancy.deckhouse.io_grantableclusterresourcereferences.yaml@a85c7f3f8e4b
[modules/160-multitenancy-manager/crds/cluster-objects-controller]
multitenancy.deckhouse.io availableresources - - multitenancy.deckhouse.io_availableresources.yaml@1009a72db5a8
multitenancy.deckhouse.io clustergrantableresources - - multitenancy.deckhouse.io_clustergrantableresources.yaml@3734f6626dbf
multitenancy.deckhouse.io clusterobjectgrantpolicies - - multitenancy.deckhouse.io_clusterobjectgrantpolicies.yaml@fdd87ab38151
multitenancy.deckhouse.io clusterobjectgrants - - multitenancy.deckhouse.io_clusterobjectgrants.yaml@33f05a2bb9fa
multitenancy.deckhouse.io clusterresourcegrants - - multitenancy.deckhouse.io_clusterresourcegrants.yaml@f1bdd9dfefd6
multitenancy.deckhouse.io grantquotas - - multitenancy.deckhouse.io_grantquotas.yaml@33f05a2bb9fa
projects.deckhouse.io clusterobjectsgrants - - projects.deckhouse.io_clusterobjectsgrants.yaml@f7dedcae20a8
[modules/200-operator-prometheus/crds]
monitoring.coreos.com alertmanagerconfigs Namespaced - alertmanagerconfigs.yaml
monitoring.coreos.com alertmanagers Namespaced status alertmanagers.yaml
monitoring.coreos.com podmonitors Namespaced - podmonitors.yaml
monitoring.coreos.com probes Namespaced - probes.yaml
monitoring.coreos.com prometheusagents Namespaced status prometheusagents.yaml
monitoring.coreos.com prometheuses Namespaced status prometheuses.yaml
monitoring.coreos.com prometheusrules Namespaced - prometheusrules.yaml
monitoring.coreos.com scrapeconfigs Namespaced - scrapeconfigs.yaml
monitoring.coreos.com servicemonitors Namespaced - servicemonitors.yaml
monitoring.coreos.com thanosrulers Namespaced status thanosrulers.yaml
[modules/300-prometheus/crds]
deckhouse.io clusteralerts Cluster status clusteralerts.yaml
deckhouse.io customalertmanagers Cluster status customalertmanager.yaml
deckhouse.io customprometheusrules Cluster - customprometheusrules.yaml
deckhouse.io grafanaadditionaldatasources Cluster - grafanaadditionaldatasources.yaml
deckhouse.io grafanaalertschannels Cluster - grafanaalertschannel.yaml
deckhouse.io grafanadashboarddefinitions Cluster - grafanadashboarddefinition.yaml
deckhouse.io prometheusremotewrites Cluster - prometheusremotewrite.yaml
[modules/301-prometheus-metrics-adapter/crds]
deckhouse.io clusterdaemonsetmetrics Cluster - clusterdaemonsetmetrics.yaml
deckhouse.io clusterdeploymentmetrics Cluster - clusterdeploymentmetrics.yaml
deckhouse.io clusteringressmetrics Cluster - clusteringressmetrics.yaml
deckhouse.io clusterpodmetrics Cluster - clusterpodmetrics.yaml
deckhouse.io clusterservicemetrics Cluster - clusterservicemetrics.yaml
deckhouse.io clusterstatefulsetmetrics Cluster - clusterstatefulsetmetrics.yaml
deckhouse.io daemonsetmetrics Namespaced - daemonsetmetrics.yaml
deckhouse.io deploymentmetrics Namespaced - deploymentmetrics.yaml
deckhouse.io ingressmetrics Namespaced - ingressmetrics.yaml
deckhouse.io namespacemetrics Namespaced - namespacemetrics.yaml
deckhouse.io podmetrics Namespaced - podmetrics.yaml
deckhouse.io servicemetrics Namespaced - servicemetrics.yaml
deckhouse.io statefulsetmetrics Namespaced - statefulsetmetrics.yaml
[modules/302-vertical-pod-autoscaler/crds]
autoscaling.k8s.io verticalpodautoscalercheckpoints Namespaced - verticalpodautoscalercheckpoint.yaml
autoscaling.k8s.io verticalpodautoscalers Namespaced status verticalpodautoscaler.yaml
[modules/400-descheduler/crds]
deckhouse.io deschedulers Cluster - deschedulers.yaml
[modules/402-ingress-nginx/crds]
deckhouse.io ingressnginxcontrollers Cluster status ingress-nginx.yaml
[modules/402-ingress-nginx/crds/kruise]
apps.kruise.io daemonsets Namespaced scale,status crd_daemonsets.yaml
[modules/460-log-shipper/crds]
deckhouse.io clusterlogdestinations Cluster - cluster-log-destination.yaml
deckhouse.io clusterloggingconfigs Cluster - cluster-logging-config.yaml
deckhouse.io podloggingconfigs Namespaced - pod-logging-config.yaml
[modules/500-upmeter/crds]
deckhouse.io downtimes Cluster - downtime.yaml
deckhouse.io upmeterhookprobes Cluster - upmeterhookprobe.yaml
deckhouse.io upmeterremotewrites Cluster - upmeterremotewrite.yaml
"""
