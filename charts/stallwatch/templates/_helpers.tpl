{{/* The chart name, or nameOverride. */}}
{{- define "stallwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object's name: fullnameOverride, or the release name (with the chart
name when the release name does not contain it). Short enough for "-restarter-token". */}}
{{- define "stallwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "stallwatch.exporter.fullname" -}}
{{- printf "%s-exporter" (include "stallwatch.fullname" .) }}
{{- end }}

{{- define "stallwatch.restarter.fullname" -}}
{{- printf "%s-restarter" (include "stallwatch.fullname" .) }}
{{- end }}

{{- define "stallwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "stallwatch.labels" -}}
helm.sh/chart: {{ include "stallwatch.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stallwatch
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of a component: pass (dict "ctx" $ "component" "exporter"). */}}
{{- define "stallwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stallwatch.name" .ctx }}-{{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end }}

{{/* All labels of a component's objects. */}}
{{- define "stallwatch.componentLabels" -}}
{{ include "stallwatch.labels" .ctx }}
{{ include "stallwatch.selectorLabels" . }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image reference: registry/repository, then @digest or :tag (appVersion). */}}
{{- define "stallwatch.image" -}}
{{- $registry := .Values.global.imageRegistry | default .Values.image.registry }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}{{ $repository = printf "%s/%s" $registry $repository }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{- define "stallwatch.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Whether the AlertmanagerConfig is rendered: alertmanagerConfig.enabled, or (null)
restarter.enabled. */}}
{{- define "stallwatch.alertmanagerConfig.enabled" -}}
{{- if kindIs "invalid" .Values.alertmanagerConfig.enabled }}
{{- if .Values.restarter.enabled }}true{{ end }}
{{- else if .Values.alertmanagerConfig.enabled }}true{{ end }}
{{- end }}

{{- define "stallwatch.restarter.serviceAccountName" -}}
{{- if .Values.restarter.serviceAccount.create }}
{{- .Values.restarter.serviceAccount.name | default (include "stallwatch.restarter.fullname" .) }}
{{- else }}
{{- .Values.restarter.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}

{{- define "stallwatch.restarter.tokenSecret" -}}
{{- .Values.restarter.token.existingSecret | default (printf "%s-token" (include "stallwatch.restarter.fullname" .)) }}
{{- end }}

{{/* restarter.quarantine.mode as the restarter's config spells it. */}}
{{- define "stallwatch.restarter.quarantineMode" -}}
{{- $modes := dict "readinessGate" "readiness_gate" "label" "label" "off" "off" }}
{{- $mode := .Values.restarter.quarantine.mode }}
{{- if kindIs "bool" $mode }}{{ $mode = ternary "on" "off" $mode }}{{ end }}{{/* YAML reads a bare off as false */}}
{{- if not (hasKey $modes (toString $mode)) }}
{{- fail (printf "restarter.quarantine.mode: %q is none of readinessGate, label, off" $mode) }}
{{- end }}
{{- get $modes $mode }}
{{- end }}

{{/* The restarter's config: the values' config, with what the chart owns set over it. */}}
{{- define "stallwatch.restarter.config" -}}
{{- $config := deepCopy .Values.restarter.config }}
{{- $_ := set $config "listen" "0.0.0.0:9733" }}
{{- $_ := set $config "token_file" (printf "/etc/stallwatch-token/%s" .Values.restarter.token.key) }}
{{- $_ := set $config "journal" "/var/lib/stallwatch/journal.sqlite" }}
{{- $kubernetes := deepCopy (get $config "kubernetes" | default dict) }}
{{- $lease := dict "name" (include "stallwatch.restarter.fullname" .) "namespace" .Release.Namespace "duration" .Values.restarter.lease.duration "renew_every" .Values.restarter.lease.renewEvery }}
{{- $_ := set $kubernetes "lease" $lease }}
{{- $_ := set $kubernetes "quarantine_mode" (include "stallwatch.restarter.quarantineMode" .) }}
{{- $_ := set $config "kubernetes" $kubernetes }}
{{- toYaml $config }}
{{- end }}

{{/* The Kubernetes action modes of the restarter's rules and fixed targets. */}}
{{- define "stallwatch.restarter.actionModes" -}}
{{- $modes := list }}
{{- range (concat (.Values.restarter.config.rules | default list) (.Values.restarter.config.targets | default list)) }}
{{- $action := .action | default dict }}
{{- if or (eq (toString ($action.kind | default "")) "kubernetes") (hasKey . "selector") }}
{{- $modes = append $modes ($action.mode | default "evict") }}
{{- end }}
{{- end }}
{{- $modes | uniq | sortAlpha | join "," }}
{{- end }}

{{/* The namespaces of the restarter's rules. */}}
{{- define "stallwatch.restarter.ruleNamespaces" -}}
{{- $namespaces := list }}
{{- range (.Values.restarter.config.rules | default list) }}
{{- $namespaces = concat $namespaces (.namespaces | default list) }}
{{- end }}
{{- range (.Values.restarter.config.targets | default list) }}
{{- if .action }}{{ if .action.namespace }}{{ $namespaces = append $namespaces .action.namespace }}{{ end }}{{ end }}
{{- end }}
{{- $namespaces | uniq | sortAlpha | join "," }}
{{- end }}
