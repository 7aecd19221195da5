{{/*
The StatefulSet .name of this release's namespace as the cluster holds it now, as JSON: "{}"
on a first install and under `helm template` or --dry-run=client, where lookup finds nothing
(it asks the API server only on a real install or upgrade, and with --dry-run=server).
Call with (dict "ctx" $ "name" "strom-storage"). The upgrade guards (_upgrade.tpl) read it;
tests/unit/test_helm_chart.py replaces this file to hand them the objects of a release.
*/}}
{{- define "strom.existingStatefulSet" -}}
{{- lookup "apps/v1" "StatefulSet" .ctx.Release.Namespace .name | toJson }}
{{- end }}
