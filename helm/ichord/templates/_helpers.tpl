{{/* Names and labels shared by every template. */}}

{{- define "ichord.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ichord.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ichord.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ichord.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ichord.labels" -}}
{{ include "ichord.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ichord.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ichord.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The daemon's warning window: its own value, else the alert's, so the two agree by default. */}}
{{- define "ichord.certificateExpiryWarningDays" -}}
{{- default .Values.prometheus.rules.certificateExpiryDays .Values.controller.certificateExpiryWarningDays -}}
{{- end -}}
