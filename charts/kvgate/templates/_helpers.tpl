{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "kvgate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name: the release name alone when it already contains the chart name. */}}
{{- define "kvgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvgate
{{- end }}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "kvgate.evalImage" -}}
{{- printf "%s:%s" .Values.evalImage.repository (default .Chart.AppVersion .Values.evalImage.tag) }}
{{- end }}

{{/* Namespaces to grant Roles in: the watch list, or nothing in cluster-wide mode. */}}
{{- define "kvgate.watchNamespaces" -}}
{{- if not .Values.watch.allNamespaces }}
{{- if not .Values.watch.namespaces }}
{{- fail "watch.namespaces must list at least one namespace when watch.allNamespaces is false" }}
{{- end }}
{{- join "," (uniq .Values.watch.namespaces) }}
{{- end }}
{{- end }}

{{/* The rules the operator needs in every namespace it watches. */}}
{{- define "kvgate.namespacedRules" -}}
# The custom resource itself; status and finalizers are subresources (kopf writes both).
- apiGroups: [kvgate.io]
  resources: [kvcacherollouts]
  verbs: [get, list, watch, patch, update]
- apiGroups: [kvgate.io]
  resources: [kvcacherollouts/status]
  verbs: [get, patch, update]
# Children get owner references with blockOwnerDeletion, which needs update on finalizers.
- apiGroups: [kvgate.io]
  resources: [kvcacherollouts/finalizers]
  verbs: [update]
# The target: read it, patch its args on promotion (and back on revert).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, patch]
# The control and candidate pods, and their startup logs.
- apiGroups: [""]
  resources: [pods]
  verbs: [create, get, list, watch, delete]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# The paired accuracy Job.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, delete]
# Reports kept next to the rollout.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, list, watch, patch, update, delete]
# Events (kopf posts core/v1 Events; newer clients use events.k8s.io).
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.rbac.readSecrets }}
# spec.model.tokenSecretRef: read one named Secret for the Hub scan (no list or watch).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end }}

{{/* Cluster-scoped reads kopf makes at startup, whatever the watch mode. */}}
{{- define "kvgate.clusterRules" -}}
# kopf scans CRDs to resolve the resources it serves.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# kopf lists namespaces to match its namespace patterns.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
