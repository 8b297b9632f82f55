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

{{/* The env var NAME holding the Redis URL, from a Secret (it carries the password), never in the pod spec: the
     chart's <release>-grpo-redis (the built-in Redis's, or the external URL given), or redis.existingSecret. */}}
{{- define "grpo.redisUrlEnv" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  valueFrom:
    {{- if and (not $root.Values.redis.enabled) $root.Values.redis.existingSecret }}
    secretKeyRef: {name: {{ $root.Values.redis.existingSecret }}, key: redis-url}
    {{- else }}
    secretKeyRef: {name: {{ include "grpo.fullname" $root }}-redis, key: redis-url}
    {{- end }}
{{- end -}}

{{/* The decoded value under KEY of the Secret NAME this release already has (on upgrade), else "":
     include "grpo.keptSecret" (list $ NAME KEY). Offline (`helm template`) lookup finds nothing. */}}
{{- define "grpo.keptSecret" -}}
{{- $root := index . 0 -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace (index . 1) | default dict -}}
{{- $data := get $existing "data" | default dict -}}
{{- get $data (index . 2) | default "" | b64dec -}}
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

{{/* Env var NAME holding a token from the chart's Secret: include "grpo.tokenEnv" (list $ "GRPO_REWARD_TOKEN" "api-token").
     The API token is required (a Secret without it stops the pod rather than serve it open); the weights token
     may be missing from an existing Secret (it then defaults to the API token). */}}
{{- define "grpo.tokenEnv" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef: {name: {{ include "grpo.secretName" $root }}, key: {{ index . 2 }}{{ if ne (index . 2) "api-token" }}, optional: true{{ end }}}
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
{{/* A claim's storage class in words, for NOTES.txt: include "grpo.storageClassText" (list $ .Values.trainer.checkpoints.storageClass). */}}
{{- define "grpo.storageClassText" -}}
{{- $class := index . 1 | default (index . 0).Values.storageClass -}}
{{- if eq $class "-" -}}no class (a PersistentVolume you made)
{{- else if $class -}}class {{ $class }}
{{- else -}}the cluster's default class{{- end -}}
{{- end -}}

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
