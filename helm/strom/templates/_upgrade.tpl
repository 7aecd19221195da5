{{/*
Value changes a running release cannot take, refused on `helm upgrade` with what to do
instead (helm/strom/README.md). Each compares the values with the StatefulSet the cluster
holds now ("strom.existingStatefulSet"; nothing on a first install, so nothing is refused).
*/}}
{{- define "strom.upgradeGuards" -}}
{{- $full := include "strom.fullname" . }}
{{- $storage := include "strom.existingStatefulSet" (dict "ctx" . "name" (printf "%s-storage" $full)) | fromJson }}
{{- with $storage.spec }}
{{- include "strom.guardStorageScaleDown" (dict "ctx" $ "had" (int .replicas)) }}
{{- include "strom.guardVolume" (dict "ctx" $ "role" "storage" "spec" . "persistence" $.Values.storage.persistence) }}
{{- include "strom.guardTls" (dict "ctx" $ "spec" .) }}
{{- end }}
{{- if .Values.etcd.enabled }}
{{- $etcd := include "strom.existingStatefulSet" (dict "ctx" . "name" (printf "%s-etcd" $full)) | fromJson }}
{{- with $etcd.spec }}
{{- include "strom.guardEtcdReplicas" (dict "ctx" $ "had" (int .replicas)) }}
{{- include "strom.guardVolume" (dict "ctx" $ "role" "etcd" "spec" . "persistence" $.Values.etcd.persistence) }}
{{- end }}
{{- end }}
{{- end }}

{{/* etcd.replicas: the bundled members bootstrap one cluster (--initial-cluster-state=new
with the install's member list); a member added later would bootstrap a cluster of its own,
and a removed pod would stay a member, counted in the quorum. */}}
{{- define "strom.guardEtcdReplicas" -}}
{{- $want := int .ctx.Values.etcd.replicas }}
{{- if ne .had $want }}
{{- fail (printf "etcd.replicas is fixed after install: the bundled etcd has %d members and the values ask for %d, and a new member would start a cluster of its own while a removed one would stay a member; keep etcd.replicas=%d, and change the membership by hand (etcdctl member remove) or move to an external etcd: helm/strom/README.md, \"The bundled etcd's size\"" .had $want .had) }}
{{- end }}
{{- end }}

{{/* storage.replicas down: the pods of the highest ordinals go, with whatever replicas
their nodes hold (under-replicated partitions, lost ones at replication factor 1). */}}
{{- define "strom.guardStorageScaleDown" -}}
{{- $want := int .ctx.Values.storage.replicas }}
{{- if and (lt $want .had) (not .ctx.Values.storage.allowScaleDown) }}
{{- $gone := list }}
{{- range $id := untilStep $want .had 1 }}
{{- $gone = append $gone (toString $id) }}
{{- end }}
{{- fail (printf "storage.replicas %d -> %d removes storage nodes %s, which may still hold replicas (their partitions would be under-replicated, or lost at replication factor 1): first move every replica off them with `strom topics reassign TOPIC --partition P --replicas IDS` (nodes 0..%d only), wait until `strom topics reassignments` lists none, then upgrade with --set storage.allowScaleDown=true: helm/strom/README.md, \"Removing storage nodes\"" .had $want (join "," $gone) (sub $want 1)) }}
{{- end }}
{{- end }}

{{/* A quantity (20Gi, 1.5T, 1024Mi) in bytes, as a string: the API server stores claims'
sizes in canonical form (1024Mi comes back 1Gi), so sizes are compared by value. */}}
{{- define "strom.quantityBytes" -}}
{{- $q := toString . }}
{{- $num := regexFind "^[0-9.]+" $q }}
{{- $unit := trimPrefix $num $q }}
{{- $mult := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 }}
{{- if hasKey $mult $unit }}
{{- mulf (float64 $num) (get $mult $unit) | int64 }}
{{- else }}
{{- $q }}
{{- end }}
{{- end }}

{{/* A role's volume size (or persistence itself) changed: a StatefulSet's
volumeClaimTemplates are immutable, and Kubernetes would refuse the upgrade with "updates to
statefulset spec for fields other than ... are forbidden". */}}
{{- define "strom.guardVolume" -}}
{{- $had := "" }}
{{- with .spec.volumeClaimTemplates }}
{{- $had = (index . 0).spec.resources.requests.storage }}
{{- end }}
{{- $want := "" }}
{{- if .persistence.enabled }}
{{- $want = .persistence.size }}
{{- end }}
{{- if ne (include "strom.quantityBytes" $had) (include "strom.quantityBytes" $want) }}
{{- fail (printf "%s.persistence cannot change on upgrade (the volumes are %s, the values ask for %s): a StatefulSet's volumeClaimTemplates are immutable. Grow each PersistentVolumeClaim with kubectl patch, delete the StatefulSet keeping its pods (kubectl delete statefulset --cascade=orphan), then upgrade: helm/strom/README.md, \"Growing the volumes\"" .role (default "none (emptyDir)" $had) (default "none (emptyDir)" $want)) }}
{{- end }}
{{- end }}

{{/* tls.enabled changed on a running release: a rolling restart never finishes (the first
node restarted with TLS cannot fetch from its plaintext peers, so it never becomes ready
and every partition stays one replica short). The storage nodes' args say whether the
release runs TLS now. */}}
{{- define "strom.guardTls" -}}
{{- $had := false }}
{{- range (index .spec.template.spec.containers 0).args }}
{{- if hasPrefix "--tls-cert=" . }}
{{- $had = true }}
{{- end }}
{{- end }}
{{- $want := .ctx.Values.tls.enabled }}
{{- if and (ne $had $want) (not .ctx.Values.tls.allowChangeOnUpgrade) }}
{{- fail (printf "tls.enabled %t -> %t cannot roll: a node restarted with the new setting cannot replicate from the others, never becomes ready, and the rollout stops with every partition one replica short. Stop every strom pod first (kubectl scale statefulset --replicas=0, or helm uninstall, which keeps the volumes), then upgrade (or install) with the new setting and --set tls.allowChangeOnUpgrade=true: helm/strom/README.md, \"Turning TLS on or off\"" $had $want) }}
{{- end }}
{{- end }}
