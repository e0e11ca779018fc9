{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "sluice.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release full name: the release name, or release-chart when the release name lacks the chart's. */}}
{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "sluice.sidecarImage" -}}
{{- printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) }}
{{- end }}

{{/* Names shared by several templates. */}}
{{- define "sluice.webhookName" -}}{{ include "sluice.fullname" . }}-webhook{{- end }}
{{- define "sluice.webhookCertSecret" -}}{{ include "sluice.fullname" . }}-webhook-tls{{- end }}
{{- define "sluice.metricsApiName" -}}{{ include "sluice.fullname" . }}-metrics-api{{- end }}
{{- define "sluice.metricsApiCertSecret" -}}{{ include "sluice.fullname" . }}-metrics-api-tls{{- end }}
{{- define "sluice.configSigningSecret" -}}{{ include "sluice.fullname" . }}-config-signing{{- end }}
{{- define "sluice.mutatingWebhookConfigName" -}}{{ include "sluice.fullname" . }}{{- end }}

{{/* What the operator does to namespaced objects: in the ClusterRole, or in a Role per watched namespace. */}}
{{- define "sluice.namespacedRules" -}}
  # Its own custom resources.
  - apiGroups: [sluice.dev]
    resources: [ratelimitpolicies, jobqueues]
    verbs: [get, list, watch, patch, update]
  - apiGroups: [sluice.dev]
    resources: [ratelimitpolicies/status, jobqueues/status]
    verbs: [get, patch, update]
  # Rendered sidecar config, owned by each RateLimitPolicy / JobQueue.
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, list, watch, create, patch, update, delete]
  # Per RateLimitPolicy, the NetworkPolicy admitting ingress to its pods only through the sidecar.
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, list, watch, create, patch, update, delete]
  # Services: which ones send traffic to a governed app's own port (status AppPortExposed).
  - apiGroups: [""]
    resources: [services]
    verbs: [list]
  # Pods: which ones a policy selects, and pod-deletion-cost on idle workers before scale-in.
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch, patch]
  - apiGroups: [""]
    resources: [events]
    verbs: [create, patch]
  - apiGroups: [events.k8s.io]
    resources: [events]
    verbs: [create, patch]
  # Worker Deployments and their scaling.
  - apiGroups: [apps]
    resources: [deployments]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [apps]
    resources: [deployments/scale]
    verbs: [get, patch, update]
  - apiGroups: [autoscaling]
    resources: [horizontalpodautoscalers]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [keda.sh]
    resources: [scaledobjects]
    verbs: [get, list, watch, create, patch, update, delete]
{{- end }}

{{/*
The queue API reviewers' ClusterRole and ClusterRoleBinding (queueapi-rbac.yaml).
*/}}
{{- define "sluice.queueApiReviewerName" -}}
{{ include "sluice.fullname" . }}-queue-api-reviewer
{{- end }}

{{/*
The reviewers' ClusterRoleBinding: another name when the operator keeps its subjects, so that switching
between that and listed namespaces replaces the binding instead of fighting over its subjects (Helm's
server-side apply would conflict with the operator's field manager).
*/}}
{{- define "sluice.queueApiReviewerBindingName" -}}
{{ include "sluice.queueApiReviewerName" . }}{{ if include "sluice.queueApiReviewerBindingManaged" . }}-jobqueues{{ end }}
{{- end }}

{{/*
"true" when the operator keeps the reviewers' binding to the namespaces holding JobQueues: queue API auth
on and neither queueApi.reviewerNamespaces nor watchNamespaces lists any namespace.
*/}}
{{- define "sluice.queueApiReviewerBindingManaged" -}}
{{- if and (eq .Values.queueApi.auth "kubernetes") (not .Values.queueApi.reviewerNamespaces) (not .Values.watchNamespaces) -}}
true
{{- end }}
{{- end }}
