{{/* The release's name names its objects: `helm install vllm-llama ...` makes vllm-llama. */}}
{{- define "vllm-kvwatch.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-kvwatch.labels" -}}
app.kubernetes.io/name: vllm
app.kubernetes.io/instance: {{ include "vllm-kvwatch.fullname" . }}
{{- end -}}

{{- define "vllm-kvwatch.selector" -}}
app.kubernetes.io/instance: {{ include "vllm-kvwatch.fullname" . }}
{{- end -}}
