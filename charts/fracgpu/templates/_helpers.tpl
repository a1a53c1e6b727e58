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
{{- define "fracgpu.settingsCheckName" -}}{{ include "fracgpu.fullname" . }}-settings-check{{- end -}}
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

{{/* The webhook's settings as FRACGPU_* variables (and POD_IP), for its container:
include "fracgpu.webhookEnv" . | nindent N. The Deployment and the settings-check hook Job
both include this one list, so the hook checks exactly what the webhook starts with. */}}
{{- define "fracgpu.webhookEnv" -}}
{{- $memory := .Values.webhook.defaultGpuMemory -}}
# Every setting is a FRACGPU_* variable (docs/configuration.md).
- name: FRACGPU_IN_CLUSTER
  value: "true"
- name: FRACGPU_IDENTITY
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: FRACGPU_LEASE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: FRACGPU_LEASE_NAME
  value: {{ .Values.webhook.leaderElection.leaseName | quote }}
- name: FRACGPU_PORT
  value: {{ .Values.webhook.port | int64 | quote }}
- name: FRACGPU_TLS_CERT_FILE
  value: /etc/fracgpu/tls/tls.crt
- name: FRACGPU_TLS_KEY_FILE
  value: /etc/fracgpu/tls/tls.key
- name: FRACGPU_TLS_RELOAD_SECONDS
  value: {{ .Values.webhook.tlsReloadSeconds | quote }}
- name: FRACGPU_POLICY
  value: {{ .Values.webhook.placementPolicy | quote }}
- name: FRACGPU_HELD_WHOLE_NODES
  value: {{ .Values.webhook.heldWholeNodes | quote }}
# The agent's host directories (agent-daemonset.yaml): no pod may mount them.
- name: FRACGPU_PROTECTED_HOST_PATHS
  value: {{ printf "%s/device-plugins,%s/pod-resources,%s/pods,%s" .Values.agent.kubeletRootDir .Values.agent.kubeletRootDir .Values.agent.kubeletRootDir .Values.agent.hostDir | quote }}
- name: FRACGPU_GPU_NODE_TAINT
  value: {{ .Values.webhook.gpuNodeTaint | quote }}
- name: FRACGPU_SPLIT_COUNT
  value: {{ .Values.webhook.splitCount | int64 | quote }}
- name: FRACGPU_MEMORY_SCALING
  value: {{ .Values.webhook.memoryScaling | quote }}
- name: FRACGPU_DISABLE_CORE_LIMIT
  value: {{ .Values.webhook.disableCoreLimit | quote }}
- name: FRACGPU_RESERVATION_TTL_SECONDS
  value: {{ .Values.webhook.reservationTTLSeconds | int64 | quote }}
- name: FRACGPU_PLACEMENT_ATTEMPTS
  value: {{ .Values.webhook.placementAttempts | int64 | quote }}
- name: FRACGPU_SETTLE_SECONDS
  value: {{ .Values.webhook.settleSeconds | quote }}
- name: FRACGPU_CONTROLLER_INTERVAL_SECONDS
  value: {{ .Values.webhook.controllerIntervalSeconds | quote }}
# Followers forward GPU pods to the leader at the URL it writes into the Lease.
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: FRACGPU_ADVERTISE_URL
  value: "https://$(POD_IP):{{ .Values.webhook.port | int64 }}"
- name: FRACGPU_TAKEOVER_GRACE_SECONDS
  value: {{ .Values.webhook.leaderElection.takeoverGraceSeconds | quote }}
- name: FRACGPU_WRITE_BEHIND_SECONDS
  value: {{ .Values.webhook.writeBehindSeconds | quote }}
# A number is MiB, as the webhook reads "4096" (int64: Helm reads numbers as floats, and
# 1e+06 would be bytes).
- name: FRACGPU_DEFAULT_GPU_MEMORY
  value: {{ if kindIs "string" $memory }}{{ $memory | quote }}{{ else }}{{ $memory | int64 | quote }}{{ end }}
- name: FRACGPU_DEFAULT_GPU_CORES
  value: {{ .Values.webhook.defaultGpuCores | int64 | quote }}
- name: FRACGPU_DEFAULT_GPU_COUNT
  value: {{ .Values.webhook.defaultGpuCount | int64 | quote }}
- name: FRACGPU_GPUSHARE_MEMORY_UNIT
  value: {{ .Values.webhook.gpushareMemoryUnit | quote }}
- name: FRACGPU_MAX_BODY_BYTES
  value: {{ .Values.webhook.maxBodyBytes | int64 | quote }}
- name: FRACGPU_LOG_LEVEL
  value: {{ .Values.webhook.logLevel | quote }}
- name: FRACGPU_PLACEMENT_MODE
  value: {{ ternary "queue" "immediate" .Values.webhook.queue.enabled | quote }}
- name: FRACGPU_SCHEDULER_NAME
  value: {{ .Values.webhook.queue.schedulerName | quote }}
- name: FRACGPU_HELD_WAIT_SECONDS
  value: {{ .Values.webhook.queue.heldWaitSeconds | quote }}
# Plain HTTP on 127.0.0.1 only: the queue mode's scheduler sidecar is its one client.
- name: FRACGPU_EXTENDER_PORT
  value: {{ ternary (.Values.webhook.queue.extenderPort | int64) 0 .Values.webhook.queue.enabled | quote }}
- name: FRACGPU_SERVICE_ACCOUNTS
  value: {{ include "fracgpu.trustedUsers" . | quote }}
- name: FRACGPU_RESOURCE_VCUDA_CORE
  value: {{ .Values.resourceNames.vcudaCore | quote }}
- name: FRACGPU_RESOURCE_VCUDA_MEMORY
  value: {{ .Values.resourceNames.vcudaMemory | quote }}
- name: FRACGPU_RESOURCE_VCUDA_CORE_LIMIT
  value: {{ .Values.resourceNames.vcudaCoreLimit | quote }}
- name: FRACGPU_RESOURCE_HAMI_GPU
  value: {{ .Values.resourceNames.hamiGpu | quote }}
- name: FRACGPU_RESOURCE_HAMI_GPUMEM
  value: {{ .Values.resourceNames.hamiGpumem | quote }}
- name: FRACGPU_RESOURCE_HAMI_GPUMEM_PERCENTAGE
  value: {{ .Values.resourceNames.hamiGpumemPercentage | quote }}
- name: FRACGPU_RESOURCE_HAMI_GPUCORES
  value: {{ .Values.resourceNames.hamiGpucores | quote }}
- name: FRACGPU_RESOURCE_GPUSHARE_MEM
  value: {{ .Values.resourceNames.gpushareMem | quote }}
- name: FRACGPU_RESOURCE_GPUSHARE_COUNT
  value: {{ .Values.resourceNames.gpushareCount | quote }}
- name: FRACGPU_RESOURCE_HAMI_PRIORITY
  value: {{ .Values.resourceNames.hamiPriority | quote }}
{{- with .Values.webhook.extraEnv }}
{{ toYaml . }}
{{- end }}
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
