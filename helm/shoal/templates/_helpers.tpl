{{/* The name every object of this release starts with. */}}
{{- define "shoal.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Kubernetes' recommended labels, on every object. */}}
{{- define "shoal.labels" -}}
app.kubernetes.io/name: shoal
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator's objects: Deployment, ServiceAccount and its RBAC. */}}
{{- define "shoal.operatorName" -}}
{{- printf "%s-operator" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The operator pods' labels. Clusters' NetworkPolicies let pods labelled
app.kubernetes.io/name=shoal, app.kubernetes.io/component=operator (in any
namespace) reach the brokers and etcd: keep both.
*/}}
{{- define "shoal.operatorSelectorLabels" -}}
app.kubernetes.io/name: shoal
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The image the operator runs, and gives Clusters that name none. */}}
{{- define "shoal.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
