{{- /*
The module's own helpers. Each computes what the helm_lib helper named beside it computes for Deckhouse's modules
(helm_lib itself is not vendored here), from the values Deckhouse passes: the module's settings under
.Values.peering and the cluster's under .Values.global. Where the module cannot work with a value, rendering fails
with a message that names the setting and what to set instead.
*/}}

{{- define "peering.namespace" -}}d8-peering{{- end -}}

{{- /* helm_lib_module_labels: (list . (dict "app" "x")) gives heritage, module and the extra labels. */}}
{{- define "peering.labels" -}}
{{- $extra := dict -}}
{{- if gt (len .) 1 }}{{ $extra = index . 1 }}{{ end -}}
heritage: deckhouse
module: peering
{{- range $k, $v := $extra }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- /* The pods of the Deployment, for selectors. */}}
{{- define "peering.selectorLabels" -}}
app: peering
{{- end -}}

{{- /* helm_lib_module_public_domain: the global template with the service name in place of %s. */}}
{{- define "peering.publicDomainTemplate" -}}
{{- $tpl := dig "modules" "publicDomainTemplate" "" (.Values.global | default dict) | toString -}}
{{- if not $tpl -}}
{{- fail "global.modules.publicDomainTemplate is not set: the peering module publishes peering.<domain> and peering-gateway.<domain>; set global.modules.publicDomainTemplate in the ModuleConfig global to a template with %s where the service name goes, such as \"%s.example.com\"" -}}
{{- end -}}
{{- $count := len (regexFindAll "%s" $tpl -1) -}}
{{- if eq $count 0 -}}
{{- fail (print "global.modules.publicDomainTemplate " ($tpl | quote) " has no %s, so the module cannot name its hosts peering.<domain> and peering-gateway.<domain>: set it to a template with %s where the service name goes, such as \"%s.example.com\"") -}}
{{- end -}}
{{- if gt $count 1 -}}
{{- fail (print "global.modules.publicDomainTemplate " ($tpl | quote) " has %s " $count " times: set it to a template with %s exactly once, such as \"%s.example.com\"") -}}
{{- end -}}
{{- if regexMatch "%[^s]" (replace "%s" "" $tpl) -}}
{{- fail (print "global.modules.publicDomainTemplate " ($tpl | quote) " has a % that is not part of %s: set it to a template such as \"%s.example.com\"") -}}
{{- end -}}
{{- $tpl -}}
{{- end -}}

{{- /* A public host of the module: (list . "peering") gives peering.<domain>. */}}
{{- define "peering.publicHost" -}}
{{- $root := index . 0 -}}
{{- $tpl := include "peering.publicDomainTemplate" $root -}}
{{- $host := replace "%s" (index . 1) $tpl -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $host) -}}
{{- fail (print "global.modules.publicDomainTemplate " ($tpl | quote) " makes " ($host | quote) ", which is not a DNS name: set it to lower-case DNS labels with %s, such as \"%s.example.com\"") -}}
{{- end -}}
{{- $host -}}
{{- end -}}

{{- /* helm_lib_module_https_mode: the module's https.mode, else global.modules.https.mode. The join endpoint
carries a one-time connection string, so it must be served over HTTPS by the Ingress itself. */}}
{{- define "peering.httpsMode" -}}
{{- $module := dig "https" "mode" "" (.Values.peering | default dict) | toString -}}
{{- $global := dig "modules" "https" "mode" "CertManager" (.Values.global | default dict) | toString -}}
{{- $mode := $module | default $global -}}
{{- $where := ternary "peering.https.mode" "global.modules.https.mode" (ne $module "") -}}
{{- if has $mode (list "Disabled" "OnlyInURI") -}}
{{- fail (print $where " is " ($mode | quote) ", which the peering module cannot work with: its join endpoint peering.<domain> must be served over HTTPS by the Ingress; set https.mode of the peering ModuleConfig (or global.modules.https.mode) to CertManager or CustomCertificate") -}}
{{- end -}}
{{- if not (has $mode (list "CertManager" "CustomCertificate")) -}}
{{- fail (print $where " " ($mode | quote) " is not a known mode: set it to CertManager or CustomCertificate") -}}
{{- end -}}
{{- if and (eq $mode "CertManager") (not (has "cert-manager" (.Values.global.enabledModules | default list))) -}}
{{- fail (print $where " is CertManager but the cert-manager module is disabled: enable cert-manager, or set https.mode of the peering ModuleConfig to CustomCertificate") -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{- /* helm_lib_module_https_cert_manager_cluster_issuer_name */}}
{{- define "peering.clusterIssuerName" -}}
{{- $module := dig "https" "certManager" "clusterIssuerName" "" (.Values.peering | default dict) -}}
{{- $module | default (dig "modules" "https" "certManager" "clusterIssuerName" "letsencrypt" (.Values.global | default dict)) -}}
{{- end -}}

{{- /* The name of the CustomCertificate Secret in d8-system; the hook copies its data into values. */}}
{{- define "peering.customCertificateSecretName" -}}
{{- $module := dig "https" "customCertificate" "secretName" "" (.Values.peering | default dict) -}}
{{- $name := $module | default (dig "modules" "https" "customCertificate" "secretName" "" (.Values.global | default dict)) -}}
{{- if or (not $name) (eq $name "false") -}}
{{- fail "https.customCertificate.secretName is not set: with https.mode CustomCertificate set https.customCertificate.secretName of the peering ModuleConfig (or global.modules.https.customCertificate.secretName) to a kubernetes.io/tls Secret in d8-system that holds the certificate of peering.<domain>, or set https.mode to CertManager" -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- /* helm_lib_module_https_secret_name (list . "ingress-tls"): the Secret the join Ingress serves. */}}
{{- define "peering.httpsSecretName" -}}
{{- $root := index . 0 -}}
{{- $prefix := index . 1 -}}
{{- if eq (include "peering.httpsMode" $root) "CustomCertificate" -}}
{{ $prefix }}-customcertificate
{{- else -}}
{{ $prefix }}
{{- end -}}
{{- end -}}

{{- /* helm_lib_module_ingress_class: the module's ingressClass, else global.modules.ingressClass. */}}
{{- define "peering.ingressClass" -}}
{{- (.Values.peering | default dict).ingressClass | default (dig "modules" "ingressClass" "nginx" (.Values.global | default dict)) -}}
{{- end -}}

{{- /* The addresses of the Ingress controllers in front of the join listener, comma-separated: the setting, else
the pod subnet (only ingress-nginx's pods may reach the join port, by the NetworkPolicy), and the node networks of
the controllers in the host network. */ -}}
{{- define "peering.joinTrustedProxies" -}}
{{- $settings := .Values.peering | default dict -}}
{{- $set := $settings.joinTrustedProxies | default list -}}
{{- if not $set -}}
{{- $global := .Values.global | default dict -}}
{{- $set = list (dig "clusterConfiguration" "podSubnetCIDR" (dig "discovery" "podSubnet" "" $global) $global) -}}
{{- end -}}
{{- join "," (concat $set ($settings.joinNodeNetworks | default list) | compact | uniq) -}}
{{- end -}}

{{- define "peering.entranceMode" -}}
{{- $mode := dig "entrance" "mode" "LoadBalancer" (.Values.peering | default dict) | toString -}}
{{- if not (has $mode (list "LoadBalancer" "IngressNginxPassthrough")) -}}
{{- fail (print "peering.entrance.mode " ($mode | quote) " is not a known mode: set entrance.mode of the peering ModuleConfig to LoadBalancer or IngressNginxPassthrough") -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{- /* The ingress class of the SSL-passthrough ingress-nginx controller of the entrance. */}}
{{- define "peering.entranceIngressClass" -}}
{{- $class := dig "entrance" "ingressNginx" "ingressClass" "" (.Values.peering | default dict) -}}
{{- if not $class -}}
{{- fail "peering.entrance.ingressNginx.ingressClass is not set: with entrance.mode IngressNginxPassthrough set entrance.ingressNginx.ingressClass of the peering ModuleConfig to the ingress class of an IngressNginxController whose inlet is LoadBalancerWithSSLPassthrough or HostPortWithSSLPassthrough, or set entrance.mode to LoadBalancer" -}}
{{- end -}}
{{- $class -}}
{{- end -}}

{{- /* helm_lib_module_image (list . "peering"): the image by its digest, as werf built it. From the module package
Deckhouse renders the module from (.Module.Package, current Deckhouse): <registry repository>/<package>@<digest>.
Otherwise the digest of global.modulesImages.digests.peering, under global.modulesImages.registry.base for a module
shipped with Deckhouse, or under <peering.registry.base>/peering for a module installed from a ModuleSource
(Deckhouse sets peering.registry from the source's registry). */}}
{{- define "peering.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $package := "" -}}
{{- with $root.Module }}{{ with .Package }}{{ if .Name }}{{ $package = . }}{{ end }}{{ end }}{{ end -}}
{{- if $package -}}
{{- $repository := $package.Registry.repository | default "" -}}
{{- $digest := index ($package.Digests | default dict) $name | default "" -}}
{{- if not (and $repository $digest) -}}
{{- fail (print "the module package " ($package.Name | quote) " has no registry repository or no digest of the image " ($name | quote) ": Deckhouse fills them in from the package's build; rebuild and republish the module") -}}
{{- end -}}
{{ trimSuffix "/" $repository }}/{{ $package.Name }}@{{ $digest }}
{{- else -}}
{{- $images := $root.Values.global.modulesImages | default dict -}}
{{- $base := dig "registry" "base" "" $images -}}
{{- $external := dig "registry" "base" "" ($root.Values.peering | default dict) -}}
{{- if $external -}}
{{- $base = printf "%s/peering" (trimAll "/" $external) -}}
{{- end -}}
{{- $digest := dig "digests" "peering" $name "" $images -}}
{{- if not (and $base $digest) -}}
{{- fail (print "global.modulesImages has no registry.base or no digests.peering." $name ": Deckhouse fills them in from the module's build; a module folder rendered by hand needs both") -}}
{{- end -}}
{{ $base }}@{{ $digest }}
{{- end -}}
{{- end -}}

{{- /* The credentials (base64 of a docker config) of the registry the module's own image comes from when it is not
Deckhouse's: those of the module package, else those Deckhouse sets in peering.registry for a module from a
ModuleSource. Empty for a module shipped with Deckhouse, whose namespace gets deckhouse-registry. */}}
{{- define "peering.moduleRegistryDockercfg" -}}
{{- $package := "" -}}
{{- with .Module }}{{ with .Package }}{{ if .Name }}{{ $package = . }}{{ end }}{{ end }}{{ end -}}
{{- if $package -}}
{{- $package.Registry.dockercfg | default "" -}}
{{- else -}}
{{- dig "registry" "dockercfg" "" (.Values.peering | default dict) -}}
{{- end -}}
{{- end -}}

{{- /* imagePullSecrets of the module's pods: deckhouse-registry (Deckhouse's registry, which Deckhouse copies into
its modules' namespaces) for the common images, and the module's own registry Secret when the module comes from
elsewhere (registry-secret.yaml). */}}
{{- define "peering.imagePullSecrets" -}}
imagePullSecrets:
  - name: deckhouse-registry
{{- if include "peering.moduleRegistryDockercfg" . }}
  - name: {{ include "peering.moduleRegistrySecretName" . }}
{{- end }}
{{- end -}}

{{- define "peering.moduleRegistrySecretName" -}}peering-module-registry{{- end -}}

{{- /* helm_lib_module_common_image (list . "kubeRbacProxy"): an image of Deckhouse's common set. */}}
{{- define "peering.commonImage" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $images := $root.Values.global.modulesImages | default dict -}}
{{- $base := dig "registry" "base" "" $images -}}
{{- $digest := dig "digests" "common" $name "" $images -}}
{{- if not (and $base $digest) -}}
{{- fail (print "global.modulesImages has no registry.base or no digests.common." $name ": Deckhouse fills them in from its common images") -}}
{{- end -}}
{{ $base }}@{{ $digest }}
{{- end -}}

{{- /* helm_lib_is_ha_to_value: the module's highAvailability when set, else global.highAvailability when set,
else whether the control plane is highly available (global.discovery.clusterControlPlaneIsHighlyAvailable, true
with three or more control plane nodes). */}}
{{- define "peering.isHA" -}}
{{- $module := .Values.peering | default dict -}}
{{- $global := .Values.global | default dict -}}
{{- if hasKey $module "highAvailability" -}}
{{- ternary "true" "" (eq (toString $module.highAvailability) "true") -}}
{{- else if hasKey $global "highAvailability" -}}
{{- ternary "true" "" (eq (toString $global.highAvailability) "true") -}}
{{- else -}}
{{- ternary "true" "" (eq (toString (dig "discovery" "clusterControlPlaneIsHighlyAvailable" false $global)) "true") -}}
{{- end -}}
{{- end -}}

{{- /* helm_lib_deployment_strategy_and_replicas_for_ha: two replicas on two nodes, replaced one at a time
(the anti-affinity is required, so a surge pod would have no node on a two-node cluster); one replica otherwise,
its successor started before it goes, since peers and consumers hold long watch streams. */}}
{{- define "peering.replicasAndStrategy" -}}
{{- if include "peering.isHA" . }}
replicas: 2
strategy:
  type: RollingUpdate
  rollingUpdate:
    maxSurge: 0
    maxUnavailable: 1
{{- else }}
replicas: 1
strategy:
  type: RollingUpdate
  rollingUpdate:
    maxSurge: 1
    maxUnavailable: 0
{{- end }}
{{- end -}}

{{- /* helm_lib_pod_anti_affinity_for_ha */}}
{{- define "peering.antiAffinity" -}}
{{- if include "peering.isHA" . }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "peering.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end -}}

{{- /* helm_lib_node_selector (tuple . "system") and helm_lib_tolerations (tuple . "system"). The node selector is
the module's own when set, else the module's dedicated nodes (node-role.deckhouse.io/peering) where the cluster has
such nodes, else Deckhouse's system nodes where it has those, else none. The tolerations are the module's own when
set, else those of the module's and the system nodes' taints (dedicated.deckhouse.io=peering, =system); either
way those of DRBD's storage problems, as for every system component. */}}
{{- define "peering.placement" -}}
{{- $module := .Values.peering | default dict -}}
{{- $byRole := dig "discovery" "d8SpecificNodeCountByRole" dict (.Values.global | default dict) -}}
{{- if $module.nodeSelector }}
nodeSelector:
  {{- toYaml $module.nodeSelector | nindent 2 }}
{{- else if gt (int (index $byRole "peering" | default 0)) 0 }}
nodeSelector:
  node-role.deckhouse.io/peering: ""
{{- else if gt (int (index $byRole "system" | default 0)) 0 }}
nodeSelector:
  node-role.deckhouse.io/system: ""
{{- end }}
tolerations:
{{- if $module.tolerations }}
  {{- toYaml $module.tolerations | nindent 2 }}
{{- else }}
  - key: dedicated.deckhouse.io
    operator: Equal
    value: peering
  - key: dedicated.deckhouse.io
    operator: Equal
    value: system
{{- end }}
  - key: drbd.linbit.com/lost-quorum
  - key: drbd.linbit.com/force-io-error
  - key: drbd.linbit.com/ignore-fail-over
{{- end -}}

{{- /* helm_lib_priority_class (tuple . "cluster-medium"): the gateway carries other modules' traffic to and
from the peers, a cluster component that may wait for the control plane's but not for applications. */}}
{{- define "peering.priorityClassName" -}}cluster-medium{{- end -}}

{{- /* helm_lib_module_pod_security_context_run_as_user_deckhouse */}}
{{- define "peering.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 64535
  runAsGroup: 64535
  fsGroup: 64535
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- /* helm_lib_module_container_security_context_read_only_root_filesystem_capabilities_drop_all */}}
{{- define "peering.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- /* helm_lib_module_ephemeral_storage_only_logs: what a container writes besides its volumes is its log. */}}
{{- define "peering.ephemeralStorageLogs" -}}
ephemeral-storage: 50Mi
{{- end -}}

{{- /* The log level the process takes (control/cli.py), from the ModuleConfig's logLevel. */}}
{{- define "peering.logLevel" -}}
{{- dig "logLevel" "Info" (.Values.peering | default dict) | upper -}}
{{- end -}}
