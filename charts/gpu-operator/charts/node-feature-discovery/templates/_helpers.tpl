{{/* Names: <release>-node-feature-discovery unless the release name already says it. */}}
{{- define "nfd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nfd.fullname" -}}
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

{{- define "nfd.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "nfd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nfd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nfd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nfd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "nfd.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The ServiceAccount of a component: its own name, <fullname>-<component>, or "default". */}}
{{- define "nfd.serviceAccountName" -}}
{{- $sa := index .root.Values .component "serviceAccount" -}}
{{- if $sa.create -}}
{{- default (printf "%s-%s" (include "nfd.fullname" .root) .component) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{/* The /healthz probes on the named port `http`, with the values' fields merged over them. */}}
{{- define "nfd.probe" -}}
{{- $probe := dict "httpGet" (dict "path" "/healthz" "port" "http") -}}
{{- toYaml (merge (deepCopy (default (dict) .)) $probe) -}}
{{- end -}}
