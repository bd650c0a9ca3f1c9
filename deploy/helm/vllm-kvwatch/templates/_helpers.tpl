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

{{/* What the schema cannot say, refused before anything renders: two ports that clash in one
pod, and an autoscaler whose floor is above its ceiling. */}}
{{- define "vllm-kvwatch.validate" -}}
{{- if eq (int .Values.vllm.port) (int .Values.kvwatch.port) -}}
{{- fail (printf "vllm.port and kvwatch.port are both %v: the two containers share the pod's network" .Values.vllm.port) -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas %v is above autoscaling.maxReplicas %v" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) -}}
{{- end -}}
{{- end -}}
