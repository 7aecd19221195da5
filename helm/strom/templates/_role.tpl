{{/*
A strom role without data (controller, coordinator): a headless Service, a Service, a
StatefulSet and a PodDisruptionBudget.
Call with (dict "ctx" $ "component" "controller" "v" .Values.controller "args" (list ...)).
Clients are sent to the active controller or the shard's coordinator by the address it
advertises, so each pod must be reachable as itself, and under TLS that address must be a
name its certificate can hold: a StatefulSet pod has a stable DNS name under the headless
Service, <pod>.<headless>.<namespace>.svc.<clusterDomain>, which the wildcard
*.<headless>.<namespace>.svc.<clusterDomain> covers (a Deployment pod has only its IP,
unknowable when the certificate is issued; found from outside).
*/}}
{{- define "strom.role" -}}
{{- $ := .ctx }}
{{- $v := .v }}
{{- $full := include "strom.fullname" $ }}
{{- $headless := include "strom.roleHeadless" (dict "ctx" $ "component" .component) }}
apiVersion: v1
kind: Service
metadata:
  name: {{ $headless }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "strom.labels" (dict "ctx" $ "component" .component) | nindent 4 }}
spec:
  clusterIP: None
  # A pod registers its name in etcd before it is ready; the name must resolve at once.
  publishNotReadyAddresses: true
  selector:
    {{- include "strom.selectorLabels" (dict "ctx" $ "component" .component) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $v.ports.grpc }}
      targetPort: grpc
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $full }}-{{ .component }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "strom.labels" (dict "ctx" $ "component" .component) | nindent 4 }}
    strom.io/job: strom-{{ .component }}
    strom.io/metrics: "true"
spec:
  type: ClusterIP
  selector:
    {{- include "strom.selectorLabels" (dict "ctx" $ "component" .component) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $v.ports.grpc }}
      targetPort: grpc
    - name: metrics
      port: {{ $v.ports.metrics }}
      targetPort: metrics
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $full }}-{{ .component }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "strom.labels" (dict "ctx" $ "component" .component) | nindent 4 }}
spec:
  serviceName: {{ $headless }}
  replicas: {{ $v.replicas }}
  # No ordering between the pods: start and replace them all at once.
  podManagementPolicy: Parallel
  updateStrategy:
    type: RollingUpdate
  selector:
    matchLabels:
      {{- include "strom.selectorLabels" (dict "ctx" $ "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "strom.labels" (dict "ctx" $ "component" .component) | nindent 8 }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "strom.serviceAccountName" $ }}
      automountServiceAccountToken: false
      {{- with $.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      {{- include "strom.placement" (dict "ctx" $ "component" .component "v" $v) | nindent 6 }}
      containers:
        - name: {{ .component }}
          image: {{ include "strom.roleImage" (dict "ctx" $ "v" $v) }}
          imagePullPolicy: {{ $.Values.image.pullPolicy }}
          command: [strom]
          args:
            - {{ .component }}
            - --listen=0.0.0.0:{{ $v.ports.grpc }}
            - --advertise=$(POD_NAME).{{ $headless }}.{{ $.Release.Namespace }}.svc.{{ $.Values.clusterDomain }}:{{ $v.ports.grpc }}
            - --metrics-port={{ $v.ports.metrics }}
            - --etcd={{ include "strom.etcdEndpoints" $ }}
            - --cluster={{ $.Values.clusterName }}
            - --log-level={{ include "strom.logLevel" (dict "ctx" $ "v" $v) }}
            {{- range .args }}
            - {{ . | quote }}
            {{- end }}
            {{- include "strom.securityArgs" $ | nindent 12 }}
            {{- range $v.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- include "strom.securityEnv" $ | nindent 12 }}
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $v.ports.grpc }}
            - name: metrics
              containerPort: {{ $v.ports.metrics }}
          {{- include "strom.grpcProbes" (dict "ctx" $ "port" $v.ports.grpc "startup" 60) | nindent 10 }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "strom.commonMounts" $ | nindent 12 }}
      volumes:
        {{- include "strom.commonVolumes" $ | nindent 8 }}
{{- /* No PodDisruptionBudget for a single pod: maxUnavailable 1 of 1 protects nothing, and
       one that allowed no disruption would block every node drain (and a managed cluster's
       node upgrades) until someone deleted the pod by hand. */}}
{{- if and $v.podDisruptionBudget.enabled (gt (int $v.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $full }}-{{ .component }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "strom.labels" (dict "ctx" $ "component" .component) | nindent 4 }}
spec:
  maxUnavailable: {{ $v.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "strom.selectorLabels" (dict "ctx" $ "component" .component) | nindent 6 }}
{{- end }}
{{- end }}
