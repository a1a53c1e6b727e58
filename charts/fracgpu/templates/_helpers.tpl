{{/* Chart name, possibly overridden. */}}
{{- define "fracgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: fullnameOverride, else the release name when it already
contains the chart name ("fracgpu"), else "<release>-<chart>". */}}
{{- define "fracgpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "fracgpu.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fracgpu.webhookName" -}}{{ include "fracgpu.fullname" . }}-webhook{{- end -}}
{{- define "fracgpu.agentName" -}}{{ include "fracgpu.fullname" . }}-agent{{- end -}}
{{- define "fracgpu.certsName" -}}{{ include "fracgpu.fullname" . }}-certs{{- end -}}
{{- define "fracgpu.certsHookName" -}}{{ include "fracgpu.fullname" . }}-certs-hook{{- end -}}
{{- define "fracgpu.secretName" -}}{{ include "fracgpu.fullname" . }}-webhook-tls{{- end -}}
{{- define "fracgpu.caSecretName" -}}{{ include "fracgpu.fullname" . }}-webhook-ca{{- end -}}
{{- define "fracgpu.mutatingName" -}}{{ include "fracgpu.fullname" . }}-mutating{{- end -}}
{{- define "fracgpu.validatingName" -}}{{ include "fracgpu.fullname" . }}-validating{{- end -}}

{{/* Labels on every object. */}}
{{- define "fracgpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "fracgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include "fracgpu.selectorLabels" (list . "webhook") */}}
{{- define "fracgpu.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "fracgpu.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Image reference: include "fracgpu.image" (list . .Values.webhook.image) */}}
{{- define "fracgpu.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $tag := default $root.Chart.AppVersion $image.tag -}}
{{- $registry := required "image.registry is not set: no fracgpu images are published yet. Build the two images (docs/quickstart.md), push them to a registry your nodes can pull from and install with --set image.registry=<that registry> (e.g. registry.example.com; for images imported into the nodes under a bare name, docker.io with containerd, localhost with CRI-O)" $root.Values.image.registry -}}
{{- printf "%s/%s:%s" $registry $image.repository $tag -}}
{{- end -}}

{{/* Usernames of fracgpu's own service accounts (allowed to write fracgpu's metadata). */}}
{{- define "fracgpu.trustedUsers" -}}
{{- $webhook := printf "system:serviceaccount:%s:%s" .Release.Namespace (include "fracgpu.webhookName" .) -}}
{{- $agent := printf "system:serviceaccount:%s:%s" .Release.Namespace (include "fracgpu.agentName" .) -}}
{{- $users := list $webhook $agent -}}
{{- join "," (concat $users .Values.webhook.extraTrustedUsers) -}}
{{- end -}}

{{/* Every configured resource name as a CEL list literal, for matchConditions. */}}
{{- define "fracgpu.celResourceList" -}}
{{- $quoted := list -}}
{{- range $key, $name := .Values.resourceNames -}}
{{- $quoted = append $quoted (printf "'%s'" $name) -}}
{{- end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{/* Resource domains the webhook checks for lookalike names (fracgpu.dialects.GPU_LOOKALIKES),
as a CEL list of prefixes for matchConditions; tests/chart holds it equal to that list. */}}
{{- define "fracgpu.celGpuDomains" -}}
['tencent.com/', 'nvidia.com/', 'aliyun.com/', 'fracgpu.io/']
{{- end -}}

{{/* Annotation prefixes that have the runtime inject devices
(webhook/admission/shimguard.DEVICE_INJECTION_PREFIXES), as a CEL list for matchConditions;
tests/chart holds it equal to that list. */}}
{{- define "fracgpu.celDeviceInjection" -}}
['cdi.k8s.io/', 'cdi-devices.nri.io/', 'devices.nri.io/']
{{- end -}}

{{/* The namespaces never sent to the webhooks besides the system ones (flow-list items). */}}
{{- define "fracgpu.exemptNamespaces" -}}
{{- join ", " (concat (list .Release.Namespace) .Values.webhooks.extraExemptNamespaces) -}}
{{- end -}}

{{/* One component's RBAC file with its placeholders filled: include "fracgpu.rbacFile" (list . "webhook") */}}
{{- define "fracgpu.rbacFile" -}}
{{- $root := index . 0 -}}
{{- $path := printf "files/rbac/%s.yaml" (index . 1) -}}
{{- $text := $root.Files.Get $path | replace "__LEASE_NAME__" $root.Values.webhook.leaderElection.leaseName -}}
{{- $text = $text | replace "__SECRET__" (include "fracgpu.secretName" $root) -}}
{{- $text = $text | replace "__CA_SECRET__" (include "fracgpu.caSecretName" $root) -}}
{{- $text = $text | replace "__MUTATING__" (include "fracgpu.mutatingName" $root) -}}
{{- $text | replace "__VALIDATING__" (include "fracgpu.validatingName" $root) -}}
{{- end -}}

{{/* Settings of fracgpu-certs as FRACGPU_CERTS_* variables:
include "fracgpu.certsEnv" (list . true). With false, the webhook configurations are left
alone (the pre-install Job runs before they exist and only makes the Secrets). */}}
{{- define "fracgpu.certsEnv" -}}
{{- $root := index . 0 -}}
{{- $webhooks := index . 1 -}}
{{- with $root -}}
- name: FRACGPU_CERTS_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: FRACGPU_CERTS_SERVICE
  value: {{ include "fracgpu.webhookName" . | quote }}
- name: FRACGPU_CERTS_SECRET
  value: {{ include "fracgpu.secretName" . | quote }}
- name: FRACGPU_CERTS_CA_SECRET
  value: {{ include "fracgpu.caSecretName" . | quote }}
- name: FRACGPU_CERTS_MUTATING_WEBHOOK
  value: {{ ternary (include "fracgpu.mutatingName" .) "" $webhooks | quote }}
- name: FRACGPU_CERTS_VALIDATING_WEBHOOK
  value: {{ ternary (include "fracgpu.validatingName" .) "" $webhooks | quote }}
- name: FRACGPU_CERTS_CLUSTER_DOMAIN
  value: {{ .Values.certs.clusterDomain | quote }}
- name: FRACGPU_CERTS_EXTRA_DNS_NAMES
  value: {{ join "," .Values.certs.extraDnsNames | quote }}
- name: FRACGPU_CERTS_EXTRA_IP_ADDRESSES
  value: {{ join "," .Values.certs.extraIpAddresses | quote }}
- name: FRACGPU_CERTS_SERVING_VALIDITY
  value: {{ .Values.certs.servingValidity | quote }}
- name: FRACGPU_CERTS_SERVING_RENEW_BEFORE
  value: {{ .Values.certs.servingRenewBefore | quote }}
- name: FRACGPU_CERTS_CA_VALIDITY
  value: {{ .Values.certs.caValidity | quote }}
- name: FRACGPU_CERTS_CA_RENEW_BEFORE
  value: {{ .Values.certs.caRenewBefore | quote }}
- name: FRACGPU_CERTS_CA_OVERLAP
  value: {{ .Values.certs.caOverlap | quote }}
- name: FRACGPU_CERTS_INTERVAL
  value: {{ .Values.certs.interval | quote }}
- name: FRACGPU_CERTS_IN_CLUSTER
  value: "true"
{{- end -}}
{{- end -}}

{{/* Hardened container security context shared by the webhook and certs containers. */}}
{{- define "fracgpu.restrictedContainer" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
