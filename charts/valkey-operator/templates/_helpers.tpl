{{/* Base name of every object: fullnameOverride, else the release name if it already says
valkey-operator, else "<release>-valkey-operator". 52 characters leave room for suffixes. */}}
{{- define "valkey-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "valkey-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "valkey-operator.labels" -}}
{{ include "valkey-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the webhook serving certificate (generated or from cert-manager). */}}
{{- define "valkey-operator.tlsSecretName" -}}
{{ include "valkey-operator.fullname" . }}-tls
{{- end -}}

{{/* The name the API server and Prometheus use to reach the operator: <service>.<namespace>.svc */}}
{{- define "valkey-operator.serviceHost" -}}
{{ include "valkey-operator.fullname" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* Every DNS name of the serving certificate. */}}
{{- define "valkey-operator.dnsNames" -}}
{{- $name := include "valkey-operator.fullname" . -}}
{{- $names := list $name (printf "%s.%s" $name .Release.Namespace) (include "valkey-operator.serviceHost" .) (printf "%s.cluster.local" (include "valkey-operator.serviceHost" .)) -}}
{{- concat $names .Values.certificate.extraDnsNames | toJson -}}
{{- end -}}

{{- define "valkey-operator.certManagerCertificate" -}}
{{ include "valkey-operator.fullname" . }}-serving
{{- end -}}
