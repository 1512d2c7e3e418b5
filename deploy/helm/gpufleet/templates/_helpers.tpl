{{/* Labels every object carries: the Kustomize base's part-of, and Helm's own. */}}
{{- define "gpufleet.labels" -}}
app.kubernetes.io/part-of: gpufleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* A component's own labels (selectors use these, never the release's). */}}
{{- define "gpufleet.componentLabels" -}}
app.kubernetes.io/name: gpufleet
app.kubernetes.io/component: {{ . }}
{{- end }}

{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* Pod security: the image's unprivileged user (deploy/Dockerfile), default seccomp. */}}
{{- define "gpufleet.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "gpufleet.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end }}

{{/* Settings from the ConfigMap, the database URL from its Secret. */}}
{{- define "gpufleet.env" -}}
envFrom:
  - configMapRef:
      name: gpufleet-config
env:
  - name: GPUFLEET_DATABASE_URL
    valueFrom:
      secretKeyRef: {name: {{ .Values.database.secretName }}, key: {{ .Values.database.secretKey }}}
{{- end }}
