{{/* Names and labels shared by every template. */}}

{{- define "ichord.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ichord.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ichord.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ichord.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels; the controller's objects add app.kubernetes.io/component: controller. */}}
{{- define "ichord.labels" -}}
{{ include "ichord.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ichord
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ichord.controllerLabels" -}}
{{ include "ichord.labels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "ichord.controllerSelectorLabels" -}}
{{ include "ichord.selectorLabels" . }}
app.kubernetes.io/component: controller
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

{{/* A probe from values: the path on the metrics port plus its timings. */}}
{{- define "ichord.probe" -}}
httpGet:
  path: {{ .path }}
  port: metrics
{{- with .probe }}
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end }}
{{- end -}}

{{/* The pod's affinity: .Values.affinity when set, else the podAntiAffinity preset. Two replicas
never share a node with "hard": a node failure leaves a standby to take the Lease. */}}
{{- define "ichord.affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity }}
{{- else if eq .Values.podAntiAffinity "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "ichord.controllerSelectorLabels" . | nindent 10 }}
{{- else if eq .Values.podAntiAffinity "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "ichord.controllerSelectorLabels" . | nindent 12 }}
{{- end -}}
{{- end -}}

{{/*
The rules of a namespace ichord serves (templates/role.yaml; the ClusterRole with watchAllNamespaces):
the bundle Secrets and the cluster locks of the TalosClusters there.
*/}}
{{- define "ichord.servedNamespaceRules" -}}
# Bundle Secrets, read uncached; update writes rotation.yaml, replaces secrets.yaml and adds the bundle
# label. list and watch: the informer on Secrets labelled ichor.maesh.dev/bundle (metadata only kept), so
# a new or changed bundle wakes its cluster. Not limited by resourceNames: each name is a TalosCluster's
# spec.secretsRef.name, chosen by its author (RBAC cannot select by label).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch, update]
# Key custody (README "Protections"): during a CA rotation update also puts the finalizer
# ichor.maesh.dev/ca-custody on the bundle Secret; create writes the custody copy
# (ichord-custody-<operation UID>, owned by the TalosOperation) and delete removes it at Done or abandon.
# Not limited by resourceNames: the copy's name is the operation's UID, unknown before it exists.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, delete]
# A health gate's caBundle (docs/decisions.md#health-gates): the ConfigMap it names, read by name each time
# the gates are asked (a bundle in a Secret is read with the get above). Its name is the gate author's.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
# Creating a Lease cannot be limited by name (RBAC does not know the name of an object being
# created): the leader Lease and each cluster's lock are created on first use.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
# The cluster locks ichord-lock-<cluster>, in each cluster's own namespace: their names follow the
# TalosClusters, so by default every Lease of the namespace; rbac.clusterLockNames limits them to the
# clusters listed.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  {{- with .Values.rbac.clusterLockNames }}
  resourceNames:
    {{- range . }}
    - {{ printf "ichord-lock-%s" . | quote }}
    {{- end }}
  {{- end }}
  verbs: [get, update]
{{- with .Values.rbac.clusterLockNames }}
# The locks' name before the rename (ichor-lock-<cluster>), read once per cluster so an operation an
# older version left holding one still fences the cluster (ichord/operations/lock.py).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames:
    {{- range . }}
    - {{ printf "ichor-lock-%s" . | quote }}
    {{- end }}
  verbs: [get]
{{- end }}
{{- end }}
