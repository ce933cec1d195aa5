{{/* Chart name, release-scoped names and the labels every object carries. */}}
{{- define "gpu-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-operator.labels" -}}
app.kubernetes.io/name: {{ include "gpu-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "gpu-operator.chart" . }}
{{- with .Values.operator.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The selector of the operator pods; never changes between releases. */}}
{{- define "gpu-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-operator.name" . }}
app.kubernetes.io/component: gpu-operator
{{- end -}}

{{/* repository/image:version, or repository/image@sha256:... for digests. */}}
{{- define "gpu-operator.image" -}}
{{- $version := .version | default "" | toString -}}
{{- if and (not .repository) (not $version) -}}
{{- .image -}}
{{- else if hasPrefix "sha256:" $version -}}
{{- printf "%s/%s@%s" .repository .image $version -}}
{{- else -}}
{{- printf "%s/%s:%s" .repository .image $version -}}
{{- end -}}
{{- end -}}

{{/*
The operator image. A values file written for NVIDIA's chart names NVIDIA's operator image
(nvcr.io/nvidia/gpu-operator, its own program, tagged with its own releases): this chart runs its
own operator instead, and NOTES.txt says so.
*/}}
{{- define "gpu-operator.namesNvidiaOperator" -}}
{{- if and (eq (toString .Values.operator.repository) "nvcr.io/nvidia") (eq (toString .Values.operator.image) "gpu-operator") }}true{{ end -}}
{{- end -}}

{{- define "gpu-operator.operatorImage" -}}
{{- $op := .Values.operator -}}
{{- if include "gpu-operator.namesNvidiaOperator" . -}}
{{- include "gpu-operator.image" (dict "repository" "ghcr.io/gpu-operator-py" "image" "gpu-operator" "version" .Chart.AppVersion) -}}
{{- else -}}
{{- include "gpu-operator.image" (dict "repository" $op.repository "image" $op.image "version" ($op.version | default .Chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{/*
A values section as ClusterPolicy YAML: every key passes through unchanged except the chart-only
keys listed in "drop" (chart-only knobs such as config.create/data never reach the API).
*/}}
{{- define "gpu-operator.section" -}}
{{- $section := omit (deepCopy .values) "nvidiaDriverCRD" "builtin" -}}
{{- range .drop }}{{ $_ := unset $section . }}{{ end -}}
{{- range $key, $value := deepCopy $section -}}
{{- if and (kindIs "string" $value) (eq $value "") }}{{ $_ := unset $section $key }}{{ end -}}
{{- /* Switches that are off and empty pod extras are left out, as NVIDIA's chart leaves them. */ -}}
{{- if and (has $key (list "hostNetwork" "hostPID" "enablePodLabels" "enablePodUID")) (kindIs "bool" $value) (not $value) }}{{ $_ := unset $section $key }}{{ end -}}
{{- if and (has $key (list "annotations" "podLabelAllowlistRegex" "config")) (empty $value) }}{{ $_ := unset $section $key }}{{ end -}}
{{- end -}}
{{- /* An image name alone is a full reference only with a tag or digest; otherwise leave the
       image to the operator's *_IMAGE fallback (e.g. vgpuManager with no registry set). */ -}}
{{- if and (hasKey $section "image") (not (hasKey $section "repository")) (not (hasKey $section "version")) -}}
{{- if not (regexMatch "[:@]" (toString $section.image)) }}{{ $_ := unset $section "image" }}{{ end -}}
{{- end -}}
{{- toYaml $section -}}
{{- end -}}

{{/* The upgrade policy with upstream's one rename: gpuPodDeletion -> podDeletion. */}}
{{- define "gpu-operator.upgradePolicy" -}}
{{- $policy := deepCopy . -}}
{{- if hasKey $policy "gpuPodDeletion" -}}
{{- $_ := set $policy "podDeletion" (get $policy "gpuPodDeletion") -}}
{{- $_ := unset $policy "gpuPodDeletion" -}}
{{- end -}}
{{- range $key := list "waitForCompletion" "drain" -}}
{{- $part := get $policy $key -}}
{{- if and (kindIs "map" $part) (hasKey $part "podSelector") (empty (get $part "podSelector")) -}}
{{- $_ := unset $part "podSelector" -}}
{{- end -}}
{{- end -}}
{{- toYaml $policy -}}
{{- end -}}

{{/* A `{name, default}` config reference, with only the keys that carry a value. */}}
{{- define "gpu-operator.configRef" -}}
{{- $out := dict -}}
{{- if .name }}{{ $_ := set $out "name" .name }}{{ end -}}
{{- if .default }}{{ $_ := set $out "default" .default }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Cluster-scoped RBAC objects the operator renders for its operands (resourceNames below). */}}
{{- define "gpu-operator.operandClusterRoles" -}}
- nvidia-cc-manager
- nvidia-container-toolkit
- nvidia-dcgm-exporter-read-pods
- nvidia-device-plugin
- nvidia-driver
- nvidia-gpu-driver
- nvidia-gpu-feature-discovery
- nvidia-kata-sandbox-device-plugin
- nvidia-device-plugin-mps-control-daemon
- nvidia-mig-manager
- nvidia-node-status-exporter
- nvidia-operator-validator
- nvidia-sandbox-device-plugin
- nvidia-sandbox-validator
- nvidia-vfio-manager
- nvidia-vgpu-device-manager
- nvidia-vgpu-driver
- nvidia-vgpu-manager
- nvidia-dra-driver-controller
- nvidia-dra-driver-kubeletplugin
- compute-domain-daemon
- nvidia-dcgm-exporter-dra-read-pods
{{- end -}}

{{/* Namespaced Roles the operator renders for its operands. */}}
{{- define "gpu-operator.operandRoles" -}}
- nvidia-container-toolkit
- nvidia-dcgm
- nvidia-dcgm-exporter
- nvidia-device-plugin
- nvidia-device-plugin-mps-control-daemon
- nvidia-driver
- nvidia-gpu-driver
- nvidia-gpu-feature-discovery
- nvidia-mig-manager
- nvidia-node-status-exporter
- nvidia-operator-validator
- nvidia-vfio-manager
- nvidia-vgpu-driver
- nvidia-vgpu-manager
- nvidia-dra-driver-controller
- nvidia-dra-driver-kubeletplugin
- nvidia-dra-driver-kubeletplugin-mps
- nvidia-dra-driver-kubeletplugin-driver-validation
- nvidia-dcgm-dra
- nvidia-dcgm-exporter-dra
{{- end -}}

{{/* RuntimeClasses the pre-requisites state creates: operator.runtimeClass, plus the CDI and
legacy ones (CDI is on by default and may be turned on later in the ClusterPolicy). */}}
{{- define "gpu-operator.runtimeClasses" -}}
{{- $main := .Values.operator.runtimeClass | default "nvidia" -}}
- {{ $main | quote }}
{{- range list "nvidia-cdi" "nvidia-legacy" }}
{{- if ne . $main }}
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The values keys of this release that the chart does not know, one dotted path per line: neither
a key of values.yaml (a superset of NVIDIA's chart's keys) nor a field of the ClusterPolicy section
a values section is passed to. files/known-values.yaml is that tree (true: anything below).
*/}}
{{- define "gpu-operator.unknownValues" -}}
{{- $known := .known -}}
{{- $prefix := .prefix -}}
{{- range $key, $value := .values -}}
{{- $path := $key -}}
{{- if $prefix }}{{ $path = printf "%s.%s" $prefix $key }}{{ end -}}
{{- if not (hasKey $known $key) }}
{{ $path }}
{{- else -}}
{{- $sub := get $known $key -}}
{{- if and (kindIs "map" $sub) (kindIs "map" $value) }}
{{ include "gpu-operator.unknownValues" (dict "values" $value "known" $sub "prefix" $path) }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Where the leader Lease lives: operator.leaderElection.namespace, else the release namespace. */}}
{{- define "gpu-operator.leaseNamespace" -}}
{{- $election := .Values.operator.leaderElection | default dict -}}
{{- $election.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* Leader election: create the Lease, then read and renew only our own (upstream's lease name). */}}
{{- define "gpu-operator.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: ["53822513.nvidia.com"]
  verbs: ["get", "update"]
{{- end -}}


{{/*
Builtin agents (ours; docs/image.md). NVIDIA's default image of every values section whose operand
has an agent of ours in the operator image (values.yaml's defaults; a test keeps them equal). With
`<section>.builtin` true, or unset and `agents.builtin` true, a section that still names this image
takes the operator image instead; a section naming any other image (one the user chose) keeps it.
A nested manager follows its section's switch when it has none of its own.
*/}}
{{- define "gpu-operator.builtinDefaults" -}}
validator: nvcr.io/nvidia/gpu-operator
driver.manager: nvcr.io/nvidia/cloud-native/k8s-driver-manager
toolkit: nvcr.io/nvidia/k8s/container-toolkit
devicePlugin: nvcr.io/nvidia/k8s-device-plugin
dcgmExporter: nvcr.io/nvidia/k8s/dcgm-exporter
gfd: nvcr.io/nvidia/k8s-device-plugin
migManager: nvcr.io/nvidia/cloud-native/k8s-mig-manager
nodeStatusExporter: nvcr.io/nvidia/gpu-operator
vgpuManager.driverManager: nvcr.io/nvidia/cloud-native/k8s-driver-manager
vgpuDeviceManager: nvcr.io/nvidia/cloud-native/vgpu-device-manager
vfioManager: nvcr.io/nvidia/cloud-native/k8s-driver-manager
vfioManager.driverManager: nvcr.io/nvidia/cloud-native/k8s-driver-manager
sandboxDevicePlugin: nvcr.io/nvidia/kubevirt-gpu-device-plugin
draDriver: nvcr.io/nvidia/dra-driver-nvidia-gpu
{{- end -}}

{{/* The operator image as repository/image/version (what gpu-operator.operatorImage joins). */}}
{{- define "gpu-operator.operatorImageParts" -}}
{{- $op := .Values.operator -}}
{{- if include "gpu-operator.namesNvidiaOperator" . -}}
{{- dict "repository" "ghcr.io/gpu-operator-py" "image" "gpu-operator" "version" .Chart.AppVersion | toYaml -}}
{{- else -}}
{{- dict "repository" $op.repository "image" $op.image "version" ($op.version | default .Chart.AppVersion | toString) | toYaml -}}
{{- end -}}
{{- end -}}

{{/* One section's switch: its own `builtin` when it is a bool, else `fallback`. */}}
{{- define "gpu-operator.builtinSwitch" -}}
{{- $section := .section | default dict -}}
{{- if and (kindIs "map" $section) (hasKey $section "builtin") (kindIs "bool" (get $section "builtin")) -}}
{{- ternary "true" "" (get $section "builtin") -}}
{{- else -}}
{{- ternary "true" "" (not (empty .fallback)) -}}
{{- end -}}
{{- end -}}

{{/*
The values sections with the builtin switches resolved, as YAML `{section: values}` for every
section the switches concern: images swapped where builtin applies, and no `builtin` key left (it
never reaches the ClusterPolicy or an NVIDIADriver). Templates use these sections in place of
.Values' ones.
*/}}
{{- define "gpu-operator.builtinSections" -}}
{{- $root := . -}}
{{- $ours := include "gpu-operator.operatorImageParts" . | fromYaml -}}
{{- $global := (.Values.agents | default dict).builtin | default false -}}
{{- $defaults := include "gpu-operator.builtinDefaults" . | fromYaml -}}
{{- $out := dict -}}
{{- range $path, $default := $defaults -}}
{{- $parts := splitList "." $path -}}
{{- $top := index $parts 0 -}}
{{- $original := get $root.Values $top -}}
{{- if kindIs "map" $original -}}
{{- if not (hasKey $out $top) }}{{ $_ := set $out $top (deepCopy $original) }}{{ end -}}
{{- $topSwitch := include "gpu-operator.builtinSwitch" (dict "section" $original "fallback" $global) -}}
{{- $target := get $out $top -}}
{{- $on := $topSwitch -}}
{{- if gt (len $parts) 1 -}}
{{- /* A nested manager: its own switch, else its section's (when that section has an agent). */ -}}
{{- $fallback := ternary $topSwitch (toString $global | eq "true" | ternary "true" "") (hasKey $defaults $top) -}}
{{- $target = get $target (index $parts 1) -}}
{{- $on = include "gpu-operator.builtinSwitch" (dict "section" $target "fallback" $fallback) -}}
{{- end -}}
{{- if kindIs "map" $target -}}
{{- if and $on (eq (printf "%s/%s" (toString $target.repository) (toString $target.image)) $default) -}}
{{- $_ := set $target "repository" $ours.repository -}}
{{- $_ := set $target "image" $ours.image -}}
{{- $_ := set $target "version" $ours.version -}}
{{- end -}}
{{- $_ := unset $target "builtin" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The top sections lose their own switch too (nested ones were handled above). */ -}}
{{- range $top, $section := $out }}{{ $_ := unset $section "builtin" }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* .Values with the builtin switches resolved (gpu-operator.builtinSections). */}}
{{- define "gpu-operator.resolvedValues" -}}
{{- $v := deepCopy .Values -}}
{{- range $key, $section := include "gpu-operator.builtinSections" . | fromYaml -}}
{{- $_ := set $v $key $section -}}
{{- end -}}
{{- toYaml $v -}}
{{- end -}}

{{/*
The runtime-config guard next to NVIDIA's toolkit (toolkit.runtimeConfigGuard): "true" or
"false". auto is on unless the toolkit DaemonSet already runs without the guard (NVIDIA's
operator's, being swapped for ours): adding it would restart every toolkit pod, and the config it
would save is no longer the node's original anyway. `helm template` cannot look: auto is on.
*/}}
{{- define "gpu-operator.runtimeConfigGuard" -}}
{{- $setting := .Values.toolkit.runtimeConfigGuard -}}
{{- if kindIs "bool" $setting -}}
{{- ternary "true" "false" $setting -}}
{{- else if has (toString $setting) (list "true" "false") -}}
{{- toString $setting -}}
{{- else if or (eq (toString $setting) "auto") (eq (toString $setting) "") (eq (toString $setting) "<nil>") -}}
{{- $ds := lookup "apps/v1" "DaemonSet" .Release.Namespace "nvidia-container-toolkit-daemonset" -}}
{{- if $ds -}}
{{- $found := "false" -}}
{{- range ($ds.spec.template.spec.initContainers | default list) -}}
{{- if eq .name "runtime-config-guard" }}{{ $found = "true" }}{{ end -}}
{{- end -}}
{{- $found -}}
{{- else -}}
true
{{- end -}}
{{- else -}}
{{- fail (printf "toolkit.runtimeConfigGuard=%v: expected true, false or auto" $setting) -}}
{{- end -}}
{{- end -}}
