{{/* Names, labels and the pieces every lorahost container shares. */}}

{{- define "lorahost.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lorahost.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lorahost.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels; call with (dict "root" $ "component" "api"). */}}
{{- define "lorahost.labels" -}}
helm.sh/chart: {{ include "lorahost.chart" .root }}
{{ include "lorahost.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end }}

{{- define "lorahost.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lorahost.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "lorahost.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lorahost.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lorahost.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- /* A base model's worker image: its own `image` when set (a vLLM image), else the chart's. */}}
{{- define "lorahost.workerImage" -}}
{{- $image := default dict .model.image }}
{{- printf "%s:%s" (default .root.Values.image.repository $image.repository) (default (default .root.Chart.AppVersion .root.Values.image.tag) $image.tag) }}
{{- end }}

{{- define "lorahost.secretName" -}}
{{- default (printf "%s-secrets" (include "lorahost.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{- define "lorahost.configMapName" -}}
{{- printf "%s-config" (include "lorahost.fullname" .) }}
{{- end }}

{{/* A base model's name, checked: it becomes part of resource names and the model's mount path. */}}
{{- define "lorahost.baseModelName" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$" (toString .name)) }}
{{- fail (printf "baseModels[].name %q must be a DNS label of at most 40 characters (lowercase letters, digits, '-')" (toString .name)) }}
{{- end }}
{{- .name }}
{{- end }}

{{/* Per base model resource name; call with (dict "root" $ "model" $model). */}}
{{- define "lorahost.workerName" -}}
{{- printf "%s-worker-%s" (include "lorahost.fullname" .root | trunc 20 | trimSuffix "-") (include "lorahost.baseModelName" .model) }}
{{- end }}

{{- define "lorahost.modelPath" -}}
{{- printf "/models/%s" .name }}
{{- end }}

{{/*
Secret-backed env vars; call with (dict "root" $ "names" (list "databaseUrl" ...)). Each name maps to its
variable below; the S3 keys are optional in the Secret (absent = boto3's default credential chain).
*/}}
{{- define "lorahost.secretEnv" -}}
{{- $vars := dict "adminKey" "LORAHOST_ADMIN_KEY" "internalToken" "LORAHOST_INTERNAL_TOKEN" "databaseUrl" "LORAHOST_DATABASE_URL" "redisUrl" "LORAHOST_REDIS_URL" "s3AccessKeyId" "AWS_ACCESS_KEY_ID" "s3SecretAccessKey" "AWS_SECRET_ACCESS_KEY" }}
{{- $root := .root }}
{{- range .names }}
- name: {{ get $vars . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "lorahost.secretName" $root }}
      key: {{ get $root.Values.secrets.keys . }}
      {{- if hasPrefix "s3" . }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}

{{/* Env of a process that talks to the DB and the blob store (API, Celery worker, beat). */}}
{{- define "lorahost.platformEnv" -}}
{{ include "lorahost.secretEnv" (dict "root" . "names" (list "adminKey" "internalToken" "databaseUrl" "redisUrl" "s3AccessKeyId" "s3SecretAccessKey")) | trim }}
{{- $model := first .Values.baseModels }}
- name: LORAHOST_BASE_MODEL_NAME
  value: {{ include "lorahost.baseModelName" $model | quote }}
{{- if $model.volume }}
- name: LORAHOST_BASE_MODEL_PATH
  value: {{ include "lorahost.modelPath" $model | quote }}
{{- end }}
{{- end }}

{{- define "lorahost.podMeta" -}}
annotations:
  checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
  {{- with .Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Pod-level settings shared by every lorahost pod. */}}
{{- define "lorahost.podSpecCommon" -}}
serviceAccountName: {{ include "lorahost.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Volumes of the first base model's files, for the API and the Celery worker. */}}
{{/* The first base model's volume for the API and the Celery worker, only when it has one (without, they read
shapes, tokenizers and chat templates from the catalog in the blob store). */}}
{{- define "lorahost.defaultModelVolume" -}}
{{- $model := first .Values.baseModels }}
{{- if $model.volume }}
- name: model
  {{- toYaml $model.volume | nindent 2 }}
{{- end }}
{{- end }}

{{- define "lorahost.defaultModelMount" -}}
{{- $model := first .Values.baseModels }}
{{- if $model.volume }}
- name: model
  mountPath: {{ include "lorahost.modelPath" $model }}
  readOnly: true
{{- end }}
{{- end }}

{{/* An exec probe against the worker's internal API (it needs the internal token, which httpGet cannot read). */}}
{{- define "lorahost.workerProbe" -}}
exec:
  command:
    - python
    - -c
    - "import os, urllib.request as r; r.urlopen(r.Request('http://127.0.0.1:{{ .port }}/internal/v1/{{ .path }}', headers={'Authorization': 'Bearer ' + os.environ['LORAHOST_INTERNAL_TOKEN']}), timeout=5)"
{{- end }}
