{{/*
Settings resolved once from the top-level values and Deckhouse's global.modules.* (see values.yaml), with a
message that names the bad value and what to set instead whenever the module cannot work with it.
*/}}

{{- define "peering.namespace" -}}d8-peering{{- end -}}

{{- define "peering.labels" -}}
heritage: deckhouse
module: peering
app.kubernetes.io/name: peering
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: peering
{{- end -}}

{{- define "peering.selectorLabels" -}}
app: peering
{{- end -}}

{{/* The public domain template: the module's own value first, then Deckhouse's global one. */}}
{{- define "peering.publicDomainTemplate" -}}
{{- $global := dig "modules" "publicDomainTemplate" "" (.Values.global | default dict) -}}
{{- $tpl := .Values.publicDomainTemplate | default $global | toString -}}
{{- if not $tpl -}}
{{- fail "publicDomainTemplate is not set: set publicDomainTemplate (or global.modules.publicDomainTemplate) to a template with %s where the service name goes, such as \"%s.example.com\"" -}}
{{- end -}}
{{- $count := len (regexFindAll "%s" $tpl -1) -}}
{{- if eq $count 0 -}}
{{- fail (print "publicDomainTemplate " ($tpl | quote) " has no %s, so the module cannot name its hosts peering.<domain> and peering-gateway.<domain>: set publicDomainTemplate (or global.modules.publicDomainTemplate) to a template with %s where the service name goes, such as \"%s.example.com\"") -}}
{{- end -}}
{{- if gt $count 1 -}}
{{- fail (print "publicDomainTemplate " ($tpl | quote) " has %s " $count " times: set publicDomainTemplate (or global.modules.publicDomainTemplate) to a template with %s exactly once, such as \"%s.example.com\"") -}}
{{- end -}}
{{- if regexMatch "%[^s]" (replace "%s" "" $tpl) -}}
{{- fail (print "publicDomainTemplate " ($tpl | quote) " has a % that is not part of %s: set it to a template such as \"%s.example.com\"") -}}
{{- end -}}
{{- $tpl -}}
{{- end -}}

{{/* A public host name of the module: peering.<domain>, peering-gateway.<domain>. */}}
{{- define "peering.publicHost" -}}
{{- $tpl := include "peering.publicDomainTemplate" .root -}}
{{- $host := replace "%s" .name $tpl -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $host) -}}
{{- fail (print "publicDomainTemplate " ($tpl | quote) " makes " ($host | quote) ", which is not a DNS name: set it to lower-case DNS labels with %s, such as \"%s.example.com\"") -}}
{{- end -}}
{{- $host -}}
{{- end -}}

{{/* https.mode: the module's own value, then global.modules.https.mode, then Deckhouse's default CertManager. */}}
{{- define "peering.httpsMode" -}}
{{- $global := dig "modules" "https" "mode" "" (.Values.global | default dict) -}}
{{- $mode := dig "mode" "" (.Values.https | default dict) | default $global | default "CertManager" | toString -}}
{{- if has $mode (list "Disabled" "OnlyInURI") -}}
{{- fail (print "https.mode " ($mode | quote) " does not work with the peering module: the join endpoint peering.<domain> must be served over HTTPS by the Ingress; set https.mode (or global.modules.https.mode) to CertManager or CustomCertificate") -}}
{{- end -}}
{{- if not (has $mode (list "CertManager" "CustomCertificate")) -}}
{{- fail (print "https.mode " ($mode | quote) " is not a known mode: set https.mode (or global.modules.https.mode) to CertManager or CustomCertificate") -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{- define "peering.clusterIssuerName" -}}
{{- $global := dig "modules" "https" "certManager" "clusterIssuerName" "" (.Values.global | default dict) -}}
{{- dig "certManager" "clusterIssuerName" "" (.Values.https | default dict) | default $global | default "letsencrypt" -}}
{{- end -}}

{{- define "peering.customCertificateSecretName" -}}
{{- $global := dig "modules" "https" "customCertificate" "secretName" "" (.Values.global | default dict) -}}
{{- $name := dig "customCertificate" "secretName" "" (.Values.https | default dict) | default $global -}}
{{- if not $name -}}
{{- fail "https.customCertificate.secretName is not set: with https.mode CustomCertificate set https.customCertificate.secretName (or global.modules.https.customCertificate.secretName) to a kubernetes.io/tls Secret in d8-peering that holds the certificate of peering.<domain>, or set https.mode to CertManager" -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The Secret the Ingress of the join endpoint serves its certificate from, by https.mode. */}}
{{- define "peering.joinTLSSecretName" -}}
{{- if eq (include "peering.httpsMode" .) "CustomCertificate" -}}
{{- include "peering.customCertificateSecretName" . -}}
{{- else -}}
peering-join-tls
{{- end -}}
{{- end -}}

{{/* Dex of user-authn is published as dex.<domain>; dex.url overrides it (e.g. an in-cluster address). */}}
{{- define "peering.dexURL" -}}
{{- $url := dig "url" "" (.Values.dex | default dict) -}}
{{- if $url -}}
{{- if not (hasPrefix "https://" $url) -}}
{{- fail (print "dex.url " ($url | quote) " is not an https:// URL: set dex.url to the issuer URL of Dex, such as \"https://dex.example.com\", or leave it empty for https://dex.<domain>") -}}
{{- end -}}
{{- $url -}}
{{- else -}}
https://{{ include "peering.publicHost" (dict "root" . "name" "dex") }}
{{- end -}}
{{- end -}}

{{- define "peering.ingressClass" -}}
{{- $global := dig "modules" "ingressClass" "" (.Values.global | default dict) -}}
{{- .Values.ingressClass | default $global | default "nginx" -}}
{{- end -}}

{{- define "peering.entranceMode" -}}
{{- $mode := dig "mode" "" (.Values.entrance | default dict) | toString -}}
{{- if not (has $mode (list "LoadBalancer" "IngressNginxPassthrough")) -}}
{{- fail (print "entrance.mode " ($mode | quote) " is not a known mode: set entrance.mode to LoadBalancer or IngressNginxPassthrough") -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{- define "peering.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | toString }}
{{- end -}}
{{- end -}}
