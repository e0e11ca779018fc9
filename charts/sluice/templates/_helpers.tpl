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
{{- define "sluice.mutatingWebhookConfigName" -}}{{ include "sluice.fullname" . }}{{- end }}
