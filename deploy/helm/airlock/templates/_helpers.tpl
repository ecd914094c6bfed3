{{/* Labels every object of the chart carries. */}}
{{- define "airlock.labels" -}}
app.kubernetes.io/part-of: airlock
app.kubernetes.io/instance: {{ .Release.Name }}
{{- if .Values.helmLabels }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
{{- end }}

{{/* The operator pods' selector: the broker's NetworkPolicy ingress source too (--broker-labels). */}}
{{- define "airlock.selector" -}}
app.kubernetes.io/name: airlock-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "airlock.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end }}
