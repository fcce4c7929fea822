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

{{/* The judge's image: pinned by digest when evalImage.digest is set. */}}
{{- define "kvgate.evalImage" -}}
{{- if .Values.evalImage.digest }}
{{- printf "%s@%s" .Values.evalImage.repository .Values.evalImage.digest }}
{{- else }}
{{- printf "%s:%s" .Values.evalImage.repository (default .Chart.AppVersion .Values.evalImage.tag) }}
{{- end }}
{{- end }}

{{/* The load Job's image (empty: the operator uses the eval image). */}}
{{- define "kvgate.loadImage" -}}
{{- with .Values.loadImage }}{{- if .repository }}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository (default $.Chart.AppVersion .tag) }}
{{- end }}
{{- end }}{{- end }}
{{- end }}

{{/* The eval Job's ServiceAccount: created per watched namespace, or named by the user
     (cluster-wide the chart cannot create one in every namespace: empty unless named). */}}
{{- define "kvgate.evalServiceAccountName" -}}
{{- if and .Values.evalServiceAccount.create (not .Values.watch.allNamespaces) }}
{{- default (printf "%s-eval" (include "kvgate.fullname" .)) .Values.evalServiceAccount.name }}
{{- else }}
{{- .Values.evalServiceAccount.name }}
{{- end }}
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

{{/* The Lease `kvgate run` elects its leader on (kvgate/adapters/leader.py lease_name):
     kvgate-leader-<first 10 hex of sha256(scope)>, scope "cluster" when cluster-wide, else the
     sorted watched namespaces joined by ",". */}}
{{- define "kvgate.leaseName" -}}
{{- $scope := "cluster" }}
{{- if not .Values.watch.allNamespaces }}
{{- $scope = include "kvgate.watchNamespaces" . | splitList "," | sortAlpha | join "," }}
{{- end }}
{{- printf "kvgate-leader-%s" (sha256sum $scope | trunc 10) }}
{{- end }}

{{/* The rules the operator needs in every namespace it watches: exactly the calls it makes
     (kvgate/adapters/kube.py) and kopf's own; tests/unit/test_rbac.py derives the set. */}}
{{- define "kvgate.namespacedRules" -}}
# The custom resource: kopf lists, watches and patches it (finalizer, annotations); kvgate lists
# it to find an earlier rollout's evaluation to reuse. No get: neither reads one by name.
- apiGroups: [kvgate.io]
  resources: [kvcacherollouts]
  verbs: [list, watch, patch]
# Phase, conditions, findings (kopf patches the status subresource).
- apiGroups: [kvgate.io]
  resources: [kvcacherollouts/status]
  verbs: [patch]
# Children get owner references with blockOwnerDeletion (kopf.adopt), which needs update on finalizers.
- apiGroups: [kvgate.io]
  resources: [kvcacherollouts/finalizers]
  verbs: [update]
# The target: read it, patch its args on promotion (and back on revert).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, patch]
# The control and candidate pods, and their startup logs.
- apiGroups: [""]
  resources: [pods]
  verbs: [create, get, list, delete]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# The paired accuracy Job.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, delete]
# The eval Job's NetworkPolicy (one per rollout, owned by it).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get, delete]
# Reports kept next to the rollout.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, patch]
# Events with distinct reasons (kopf posts core/v1 Events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.hubTokenSecrets.enabled }}
# spec.model.tokenSecretRef: get one named Secret (never list or watch); kvgate reads only
# Secrets labelled kvgate.io/hub-token="true".
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
  {{- with .Values.hubTokenSecrets.names }}
  resourceNames:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- if .Values.forgeTokenSecrets.enabled }}
# spec.promotion.pullRequest.tokenSecretRef: get one named Secret (never list or watch);
# kvgate reads only Secrets labelled kvgate.io/forge-token="true".
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
  {{- with .Values.forgeTokenSecrets.names }}
  resourceNames:
    {{- toYaml . | nindent 4 }}
  {{- end }}
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
# The verdict key's GPU: the candidate canary's and production pods' node, by name, for its
# nvidia.com/gpu.product label (get only: no list, no watch; without it the GPU is unknown).
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- end }}

{{/* CEL list of the users that may write kvcacherollouts/status: the operator's SA and extras. */}}
{{- define "kvgate.statusWriters" -}}
{{- $users := list (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "kvgate.serviceAccountName" .)) }}
{{- range .Values.statusAdmissionPolicy.extraUsers }}
{{- $users = append $users . }}
{{- end }}
{{- $quoted := list }}
{{- range $users }}
{{- $quoted = append $quoted (printf "'%s'" .) }}
{{- end }}
{{- printf "[%s]" (join ", " $quoted) }}
{{- end }}

{{/* Where the admission policies apply: the watched namespaces (everywhere when cluster-wide). */}}
{{- define "kvgate.policyNamespaces" -}}
{{- if not .Values.watch.allNamespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: [{{ include "kvgate.watchNamespaces" . | splitList "," | join ", " }}]
{{- end }}
{{- end }}

{{/* CEL variables the approval policies share: the requester, the annotations before and
     after, whether this request sets a new approval or abort, the author, the generation. */}}
{{- define "kvgate.approvalVariables" -}}
- name: user
  expression: request.userInfo.username
- name: ann
  expression: "object.metadata.?annotations.orValue({})"
- name: old
  expression: "request.operation == 'UPDATE' ? oldObject.metadata.?annotations.orValue({}) : {}"
- name: approving
  expression: >-
    variables.ann[?'kvgate.io/approve'].orValue('') != ''
    && variables.ann[?'kvgate.io/approve'] != variables.old[?'kvgate.io/approve']
- name: aborting
  expression: >-
    variables.ann[?'kvgate.io/abort'].orValue('') != ''
    && variables.ann[?'kvgate.io/abort'] != variables.old[?'kvgate.io/abort']
- name: author
  expression: >-
    request.operation == 'CREATE' ? variables.user
    : variables.old[?'kvgate.io/created-by'].orValue('')
- name: generation
  expression: "request.operation == 'UPDATE' ? oldObject.metadata.generation : 1"
{{- end }}

{{/* A Deny binding of the admission policy <fullname>-<policy>, limited to the watched
     namespaces unless the operator watches them all. Args: dict "root" . "policy" name. */}}
{{- define "kvgate.denyBinding" -}}
{{- $root := .root }}
{{- $name := printf "%s-%s" (include "kvgate.fullname" $root) .policy -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "kvgate.labels" $root | nindent 4 }}
spec:
  policyName: {{ $name }}
  validationActions: [Deny]
  {{- if not $root.Values.watch.allNamespaces }}
  matchResources:
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: In
          values: [{{ include "kvgate.watchNamespaces" $root | splitList "," | join ", " }}]
  {{- end }}
{{- end }}

{{/* A ValidatingAdmissionPolicy <fullname>-<policy> refusing spec.<section>.<field> on a
     rollout, and its Deny binding. A rollout stored with the field before the policy can still
     be updated (finalizers, deletion); adding the field to a stored one is refused.
     Args: dict "root" . "policy" "section" "field" "message". */}}
{{- define "kvgate.refuseField" -}}
{{- $root := .root }}
{{- $path := printf "spec.%s.%s" .section .field -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "kvgate.fullname" $root }}-{{ .policy }}
  labels:
    {{- include "kvgate.labels" $root | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [kvgate.io]
        apiVersions: ["*"]
        operations: [CREATE, UPDATE]
        resources: [kvcacherollouts]
  validations:
    - expression: {{ printf "!has(object.spec.%s) || !has(object.%s) || (request.operation == 'UPDATE' && has(oldObject.spec.%s) && has(oldObject.%s))" .section $path .section $path | quote }}
      message: {{ printf "%s: %s" $path .message | quote }}
      reason: Invalid
---
{{ include "kvgate.denyBinding" (dict "root" $root "policy" .policy) }}
{{- end }}
