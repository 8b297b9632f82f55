{{/* Names, labels and shared snippets. */}}

{{- define "grpo.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "grpo.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "grpo.selector" (list $ "reward") */}}
{{- define "grpo.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "grpo.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/grpo-%s:%s" $root.Values.image.registry (index . 1) $root.Values.image.tag -}}
{{- end -}}

{{- define "grpo.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "grpo.fullname" .) -}}
{{- else if not .Values.redis.existingSecret -}}
{{- required "redis.externalUrl (or redis.existingSecret) is required when redis.enabled is false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* The env var NAME holding the Redis URL: the built-in Redis's in plain text; an external one's (which may
     carry a password) from a Secret, never in the pod spec. */}}
{{- define "grpo.redisUrlEnv" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.redis.enabled -}}
- {name: {{ index . 1 }}, value: {{ include "grpo.redisUrl" $root | quote }}}
{{- else -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef: {name: {{ $root.Values.redis.existingSecret | default (printf "%s-redis" (include "grpo.fullname" $root)) }}, key: redis-url}
{{- end -}}
{{- end -}}

{{/* The Redis port the rollout and trainer pods connect to: 6379, or the external URL's own. */}}
{{- define "grpo.redisPort" -}}
{{- $hostport := regexReplaceAll "^[a-z]+://([^@/]*@)?([^/?]*).*$" (include "grpo.redisUrl" .) "${2}" -}}
{{- default (toString .Values.redis.externalPort) (regexFind "[0-9]+$" (regexFind ":[0-9]+$" $hostport)) -}}
{{- end -}}

{{/* The egress rule (a list item) that lets a pod reach Redis: the built-in one's pods, or the external one
     (`redis.externalEgress` peers, else any address) on its URL's port. */}}
{{- define "grpo.redisEgress" -}}
- {{- if .Values.redis.enabled }}
  to:
    - podSelector:
        matchLabels: {{- include "grpo.selector" (list . "redis") | nindent 10 }}
  {{- else if .Values.redis.externalEgress }}
  to: {{- toYaml .Values.redis.externalEgress | nindent 4 }}
  {{- end }}
  ports:
    - {port: {{ include "grpo.redisPort" . }}, protocol: TCP}
{{- end -}}

{{- define "grpo.secretName" -}}
{{- if .Values.auth.create -}}{{ include "grpo.fullname" . }}-auth{{- else -}}{{ required "auth.existingSecret is required when auth.create is false" .Values.auth.existingSecret }}{{- end -}}
{{- end -}}

{{/* Pod-level security context shared by the unprivileged pods. */}}
{{- define "grpo.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context: read-only root, no privilege escalation, no capabilities. */}}
{{- define "grpo.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Env shared by every service: caches and the hub token. */}}
{{- define "grpo.commonEnv" -}}
- name: GRPO_CACHE_DIR
  value: /cache
- name: HF_HOME
  value: /cache/hf
- name: HF_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ include "grpo.secretName" . }}, key: hf-token, optional: true}
{{- end -}}

{{/* Env var NAME holding the API token from the chart's Secret: include "grpo.tokenEnv" (list $ "GRPO_REWARD_TOKEN" "api-token") */}}
{{- define "grpo.tokenEnv" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef: {name: {{ include "grpo.secretName" $root }}, key: {{ index . 2 }}, optional: true}
{{- end -}}

{{/* Volumes every pod mounts: writable /tmp and /cache (the root filesystem is read-only) and the config. */}}
{{- define "grpo.volumes" -}}
- name: tmp
  emptyDir: {}
- name: cache
  {{- if .Values.modelCache.existingClaim }}
  persistentVolumeClaim: {claimName: {{ .Values.modelCache.existingClaim }}}
  {{- else }}
  emptyDir: {sizeLimit: {{ .Values.modelCache.sizeLimit }}}
  {{- end }}
- name: config
  configMap: {name: {{ include "grpo.fullname" . }}-config}
{{- end -}}

{{- define "grpo.volumeMounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: cache, mountPath: /cache}
- {name: config, mountPath: /etc/grpo, readOnly: true}
{{- end -}}

{{/* Probes on the container's "http" port: readiness is /readyz (200 only when the service can do its work:
     its Redis, sandbox, model...), liveness and start-up are /healthz (200 while the process serves), so a
     pod waiting on a dependency is taken out of rotation, not restarted. The gRPC health service stays for
     clients and balancers that ask it. */}}
{{- define "grpo.probes" -}}
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  failureThreshold: 6
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 5
  failureThreshold: 120
{{- end -}}

{{/* API versions the cluster serves: policy/v1 PodDisruptionBudget since 1.21, autoscaling/v2 HPA since 1.23.
     Against a cluster both checks are what it serves; offline, `helm template` knows every API version, so the
     Kubernetes version (--kube-version) decides. */}}
{{- define "grpo.pdbApiVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "policy/v1") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}policy/v1{{- else -}}policy/v1beta1{{- end -}}
{{- end -}}

{{- define "grpo.hpaApiVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "autoscaling/v2") (semverCompare ">=1.23-0" .Capabilities.KubeVersion.Version) -}}autoscaling/v2{{- else -}}autoscaling/v2beta2{{- end -}}
{{- end -}}

{{/* storageClassName of a claim: include "grpo.storageClass" (list $ .Values.trainer.checkpoints.storageClass).
     The claim's own value, else the chart-wide `storageClass`; "" leaves the field out (the cluster's default
     class), "-" writes storageClassName: "" (no class: bind to a pre-made PersistentVolume). */}}
{{- define "grpo.storageClass" -}}
{{- $class := index . 1 | default (index . 0).Values.storageClass -}}
{{- if eq $class "-" }}
storageClassName: ""
{{- else if $class }}
storageClassName: {{ $class | quote }}
{{- end -}}
{{- end -}}

{{/* Non-empty when the cluster has securityContext.appArmorProfile (Kubernetes 1.30+); older ones take an annotation. */}}
{{- define "grpo.appArmorField" -}}
{{- if semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- end -}}
