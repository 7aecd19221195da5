{{/* Names, labels and the values several templates share. */}}

{{- define "strom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "strom.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "strom.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; call with (dict "ctx" $ "component" "storage"). */}}
{{- define "strom.labels" -}}
helm.sh/chart: {{ include "strom.chart" .ctx }}
{{ include "strom.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: strom
{{- end }}

{{- define "strom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strom.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "strom.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "strom.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "strom.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
A role's image: image.repository at the role's imageTag when set (a rolling upgrade moves the
roles one at a time: controllers, then coordinators, then storage nodes; docs/reliability.md
"Upgrades"), else at image.tag. Call with (dict "ctx" $ "v" .Values.<role>).
*/}}
{{- define "strom.roleImage" -}}
{{- $ := .ctx }}
{{- printf "%s:%s" $.Values.image.repository (default (default $.Chart.AppVersion $.Values.image.tag) .v.imageTag) }}
{{- end }}

{{- define "strom.etcdHeadless" -}}
{{- printf "%s-etcd-headless" (include "strom.fullname" .) }}
{{- end }}

{{- define "strom.storageHeadless" -}}
{{- printf "%s-storage-headless" (include "strom.fullname" .) }}
{{- end }}

{{/* The headless Service of a role; call with (dict "ctx" $ "component" "controller"). */}}
{{- define "strom.roleHeadless" -}}
{{- printf "%s-%s-headless" (include "strom.fullname" .ctx) .component }}
{{- end }}

{{/* The DNS names tls.crt must hold (its subject alternative names), one a line: a
wildcard for each role's pods (they advertise <pod>.<headless Service>), and the bootstrap
Service clients dial first, in its short and full forms. NOTES.txt prints them. */}}
{{- define "strom.tlsDnsNames" -}}
{{- $suffix := printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain }}
{{- $full := include "strom.fullname" . }}
{{- range $c := list "storage" "controller" "coordinator" }}
{{ printf "*.%s.%s" (include "strom.roleHeadless" (dict "ctx" $ "component" $c)) $suffix }}
{{- end }}
{{ printf "%s-storage.%s" $full $suffix }}
{{ printf "%s-storage.%s.svc" $full $.Release.Namespace }}
{{ printf "%s-storage.%s" $full $.Release.Namespace }}
{{ printf "%s-storage" $full }}
{{- end }}

{{/* The etcd client endpoints the services use: every bundled member, or the external list. */}}
{{- define "strom.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $full := include "strom.fullname" . }}
{{- $headless := include "strom.etcdHeadless" . }}
{{- $eps := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $eps = append $eps (printf "%s-etcd-%d.%s.%s.svc.%s:2379" $full $i $headless $.Release.Namespace $.Values.clusterDomain) }}
{{- end }}
{{- join "," $eps }}
{{- else }}
{{- if not .Values.etcd.externalEndpoints }}
{{- fail "etcd.enabled is false: set etcd.externalEndpoints to your etcd's HOST:PORT list" }}
{{- end }}
{{- join "," .Values.etcd.externalEndpoints }}
{{- end }}
{{- end }}

{{/* The bootstrap address clients use (the storage nodes' ClusterIP Service). */}}
{{- define "strom.bootstrap" -}}
{{- printf "%s-storage.%s.svc.%s:%d" (include "strom.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.storage.ports.grpc) }}
{{- end }}

{{/* Pod anti-affinity; call with (dict "ctx" $ "component" "storage" "mode" "soft"). */}}
{{- define "strom.antiAffinity" -}}
{{- if eq .mode "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "strom.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 10 }}
{{- else }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "strom.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- end }}
{{- end }}

{{/*
Where a role's pods may run: affinity, topologySpreadConstraints and priorityClassName,
from the role's values. Call with (dict "ctx" $ "component" "storage" "v" .Values.storage).

affinity: the role's podAntiAffinity switch (one pod per Kubernetes node, soft or hard) with
the role's own `affinity` value: its nodeAffinity and podAffinity are added, and a
podAntiAffinity given there replaces the switch's (two sets of rules for the same pods would
be hard to read and easy to contradict).

topologySpreadConstraints: a constraint without a labelSelector counts this release's pods of
the role (the scheduler counts no pod for a constraint without one, so it would spread
nothing), which is what spreading a role over zones means.
*/}}
{{- define "strom.placement" -}}
{{- $selector := include "strom.selectorLabels" (dict "ctx" .ctx "component" .component) | fromYaml }}
{{- $affinity := deepCopy (.v.affinity | default dict) }}
{{- if not (hasKey $affinity "podAntiAffinity") }}
{{- $anti := include "strom.antiAffinity" (dict "ctx" .ctx "component" .component "mode" .v.podAntiAffinity) | fromYaml }}
{{- $_ := set $affinity "podAntiAffinity" $anti.podAntiAffinity }}
{{- end }}
affinity:
  {{- toYaml $affinity | nindent 2 }}
{{- $spread := list }}
{{- range .v.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $spread = append $spread $c }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Volume mounts and volumes every strom container has: /tmp (read-only root fs), TLS,
bearer tokens and etcd's TLS. */}}
{{- define "strom.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- if .Values.auth.tokens.secretName }}
- name: auth-tokens
  mountPath: /etc/strom/auth
  readOnly: true
{{- end }}
{{- if .Values.etcd.externalTls.secretName }}
- name: etcd-tls
  mountPath: /etc/strom/etcd-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "strom.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
{{- end }}
{{- if .Values.auth.tokens.secretName }}
- name: auth-tokens
  secret:
    secretName: {{ .Values.auth.tokens.secretName }}
{{- end }}
{{- if .Values.etcd.externalTls.secretName }}
- name: etcd-tls
  secret:
    secretName: {{ .Values.etcd.externalTls.secretName }}
{{- end }}
{{- end }}

{{/* The security flags of every strom service (TLS, tokens, ACLs, etcd TLS). */}}
{{- define "strom.securityArgs" -}}
{{- $t := .Values.tls }}
{{- if $t.enabled }}
- --tls-cert={{ $t.mountPath }}/tls.crt
- --tls-key={{ $t.mountPath }}/tls.key
- --tls-ca={{ $t.mountPath }}/ca.crt
- --tls-client-auth={{ $t.clientAuth }}
{{- end }}
{{- if .Values.auth.tokens.secretName }}
- --auth-tokens=/etc/strom/auth/tokens
{{- if .Values.auth.tokens.serviceTokenKey }}
- --client-token-file=/etc/strom/auth/{{ .Values.auth.tokens.serviceTokenKey }}
{{- end }}
{{- end }}
{{- /* Settings that render but cannot work: the services' own calls to each other would
       be refused (found from outside). The services (strom.service.flags) refuse them too. */ -}}
{{- $mtls := and $t.enabled (eq $t.clientAuth "required") }}
{{- if and (not $t.enabled) (eq $t.clientAuth "required") }}
{{- fail "tls.clientAuth=required asks for client certificates, which only TLS carries: set tls.enabled=true (and tls.secretName), or leave tls.clientAuth at none" }}
{{- end }}
{{- if and .Values.etcd.enabled .Values.etcd.externalTls.secretName }}
{{- fail "etcd.externalTls is for an external etcd (etcd.enabled=false with etcd.externalEndpoints); the bundled etcd does not use it: unset etcd.externalTls.secretName" }}
{{- end }}
{{- if and .Values.auth.tokens.serviceTokenKey (not .Values.auth.tokens.secretName) }}
{{- fail "auth.tokens.serviceTokenKey names a key of auth.tokens.secretName: set the Secret too" }}
{{- end }}
{{- if and .Values.auth.tokens.secretName (not .Values.auth.tokens.serviceTokenKey) (not $mtls) }}
{{- fail "auth.tokens.secretName makes every caller authenticate, the services' calls to each other too: set auth.tokens.serviceTokenKey (a service token), or tls.clientAuth=required (mTLS)" }}
{{- end }}
{{- if .Values.acls.enabled }}
{{- if not .Values.acls.superUsers }}
{{- fail "acls.enabled needs acls.superUsers: at least the services' own principal (tls.crt's subject, e.g. User:CN=strom, or the service token's principal), else their calls to each other are denied" }}
{{- end }}
{{- if not (or $mtls .Values.auth.tokens.serviceTokenKey) }}
{{- fail "acls.enabled needs the services to authenticate to each other, else they call each other as User:ANONYMOUS and are denied: set tls.enabled=true with tls.clientAuth=required (mTLS), or auth.tokens.secretName and auth.tokens.serviceTokenKey (a service token)" }}
{{- end }}
- --acls
{{- /* ';' between principals, as Kafka's super.users: a certificate's principal has commas
(User:CN=strom,O=acme), which a ',' join cut into several (found from outside). The trailing
';' makes every item one principal as it stands, whatever commas it has. */}}
- {{ printf "--super-users=%s;" (join ";" .Values.acls.superUsers) | quote }}
{{- end }}
{{- if and (not .Values.etcd.enabled) .Values.etcd.externalTls.secretName }}
- --etcd-ca=/etc/strom/etcd-tls/ca.crt
- --etcd-cert=/etc/strom/etcd-tls/tls.crt
- --etcd-key=/etc/strom/etcd-tls/tls.key
{{- end }}
{{- end }}

{{/* Environment that lets strom's health check and clients in the pod speak TLS. */}}
{{- define "strom.securityEnv" -}}
{{- if .Values.tls.enabled }}
- name: STROM_TLS_CA
  value: {{ .Values.tls.mountPath }}/ca.crt
- name: STROM_TLS_CERT
  value: {{ .Values.tls.mountPath }}/tls.crt
- name: STROM_TLS_KEY
  value: {{ .Values.tls.mountPath }}/tls.key
{{- end }}
{{- end }}

{{/* Environment of the chart's own client pods (helm test, the ACL bootstrap Job): they
act as the services' identity (their certificate or service token), a super user when ACLs
are on. Empty when neither TLS nor a service token is configured. */}}
{{- define "strom.clientEnv" -}}
{{- if .Values.tls.enabled }}
- name: STROM_SSL_CAFILE
  value: {{ .Values.tls.mountPath }}/ca.crt
{{- if eq .Values.tls.clientAuth "required" }}
- name: STROM_SSL_CERTFILE
  value: {{ .Values.tls.mountPath }}/tls.crt
- name: STROM_SSL_KEYFILE
  value: {{ .Values.tls.mountPath }}/tls.key
{{- end }}
{{- end }}
{{- if and .Values.auth.tokens.secretName .Values.auth.tokens.serviceTokenKey }}
- name: STROM_TOKEN_FILE
  value: /etc/strom/auth/{{ .Values.auth.tokens.serviceTokenKey }}
{{- end }}
{{- end }}

{{/* The same as command-line flags of the strom CLI, each after a space (NOTES.txt). */}}
{{- define "strom.clientFlags" -}}
{{- if .Values.tls.enabled }}
{{- printf " --ssl-cafile %s/ca.crt" .Values.tls.mountPath }}
{{- if eq .Values.tls.clientAuth "required" }}
{{- printf " --ssl-certfile %s/tls.crt --ssl-keyfile %s/tls.key" .Values.tls.mountPath .Values.tls.mountPath }}
{{- end }}
{{- end }}
{{- if and .Values.auth.tokens.secretName .Values.auth.tokens.serviceTokenKey }}
{{- printf " --token-file /etc/strom/auth/%s" .Values.auth.tokens.serviceTokenKey }}
{{- end }}
{{- end }}

{{/* Health probes (grpc.health.v1) on a port; call with (dict "ctx" $ "port" 9092
"startup" 60). With TLS they run strom's health check in the pod (Kubernetes' gRPC probes
cannot speak TLS). */}}
{{- define "strom.grpcProbes" -}}
{{- /* Started and alive: the health status "". Ready: "strom.ready", which a storage node
       reports only while registered and back in the ISR of every partition it replicates, so
       a rolling restart (and a PodDisruptionBudget) waits for it before stopping the next
       node. */ -}}
{{- $check := dict "grpc" (dict "port" .port) }}
{{- $ready := dict "grpc" (dict "port" .port "service" "strom.ready") }}
{{- if .ctx.Values.tls.enabled }}
{{- $check = dict "exec" (dict "command" (list "python" "-m" "strom.service.healthcheck" (printf "127.0.0.1:%d" (int .port)))) }}
{{- $ready = dict "exec" (dict "command" (list "python" "-m" "strom.service.healthcheck" "--service" "strom.ready" (printf "127.0.0.1:%d" (int .port)))) }}
{{- end }}
{{- /* timeoutSeconds on every probe: Kubernetes' default is 1 s, and the TLS exec probe
       (a Python process that imports grpc and does a handshake) took up to 0.5 s on a loaded
       2-core machine; a slow probe must not restart or unready a healthy pod (found from
       outside). */ -}}
startupProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: {{ .startup }}
readinessProbe:
  {{- toYaml $ready | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end }}

{{/*
A role's --log-level: its own logLevel, else the global one (the services take warn as warning).
Call with (dict "ctx" $ "v" .Values.<role>).
*/}}
{{- define "strom.logLevel" -}}
{{- default .ctx.Values.logLevel .v.logLevel -}}
{{- end }}
