"""helm/strom: ``helm lint --strict``, ``helm template`` of the default values and three more
value sets, every rendered manifest validated offline against the Kubernetes schemas
(``kubernetes-validate --strict``), and what the manifests must say.

That the processes the manifests describe form a working cluster is
tests/integration/test_helm_processes.py. No Kubernetes cluster runs here.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.helm_chart import CHART, ROOT, VALUE_SETS, helm, render

KUBE_VALIDATE = str(Path(sys.executable).parent / "kubernetes-validate")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
#: Custom resources the Kubernetes schemas do not hold (checked by hand below).
CRDS = {"ServiceMonitor", "PrometheusRule"}


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(obj: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]
    cs = spec["containers"]
    return next(c for c in cs if name is None or c["name"] == name)


@pytest.mark.parametrize(
    "values",
    [[], *[v for v in VALUE_SETS.values() if v]],
    ids=["default", *[k for k, v in VALUE_SETS.items() if v]],
)
def test_helm_lint_strict(values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for v in values:
        args += ["-f", str(v)]
    proc = helm(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_manifests_pass_kubernetes_validate_strict(name: str, tmp_path: Path) -> None:
    validate(render(VALUE_SETS[name]), tmp_path)


def validate(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """Every manifest passes ``kubernetes-validate --strict`` (custom resources aside)."""
    files = []
    for i, d in enumerate(docs):
        f = tmp_path / f"{i:02d}-{d['kind']}-{d['metadata']['name']}.yaml"
        f.write_text(yaml.safe_dump(d))
        files.append(f)
    # The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest known.
    for version in ("1.28.0", "1.37.0"):
        proc = subprocess.run(
            [KUBE_VALIDATE, "--strict", "-k", version, *map(str, files)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        for line in out.splitlines():
            if line.startswith("INFO") and "passed" in line:
                continue
            assert line.startswith("WARN") and any(f"kind {k} " in line for k in CRDS), line
        passed = sum("passed" in line for line in out.splitlines())
        assert passed == sum(d["kind"] not in CRDS for d in docs)


#: Kinds whose objects hold a pod template, and the path to its spec.
POD_TEMPLATES = {
    "StatefulSet": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec the manifests would run, by "<kind>/<name>"."""
    out = {}
    for d in docs:
        path = POD_TEMPLATES.get(d["kind"])
        if path is None:
            continue
        spec = d
        for key in path:
            spec = spec[key]
        out[f"{d['kind']}/{d['metadata']['name']}"] = spec
    return out


#: Values under which the chart renders every kind of pod it has: strom's roles, the bundled
#: etcd, the ACL bootstrap Job, the helm test pod and the storage nodes' zone init container.
EVERY_POD = [
    "tls.enabled=true,tls.secretName=strom-tls,tls.clientAuth=required",
    "acls.enabled=true,acls.superUsers={User:CN=strom}",
    "acls.bootstrap[0].principal=User:CN=app,acls.bootstrap[0].allow={read}",
    "acls.bootstrap[0].topic=orders,storage.rack.fromNodeZone=true",
]


def test_image_pull_secrets_reach_every_pod() -> None:
    """imagePullSecrets reached the strom StatefulSets only: the bundled etcd, the ACL
    bootstrap Job and the helm test pod pulled without them, so with a private registry
    nothing started (found from outside). Every pod spec of every kind now has them."""
    secrets = "imagePullSecrets[0].name=regcred,imagePullSecrets[1].name=mirror"
    specs = pod_specs(render([], sets=[*EVERY_POD, secrets]))
    assert {"StatefulSet/strom-etcd", "Job/strom-acls", "Pod/strom-test-produce-consume"} <= set(
        specs
    )
    assert len(specs) == 6
    for name, spec in specs.items():
        assert spec.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "mirror"}], name
    for name, spec in pod_specs(render([])).items():
        assert "imagePullSecrets" not in spec, name
    proc = helm("template", "s", str(CHART), "--set", "imagePullSecrets[0].nam=regcred")
    assert proc.returncode != 0 and "imagePullSecrets" in proc.stderr


def test_kubernetes_validate_rejects_an_unknown_field(tmp_path: Path) -> None:
    d = by_kind(render([]), "StatefulSet")["strom-storage"]
    d["spec"]["template"]["spec"]["containers"][0]["livenessProbee"] = {}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(d))
    proc = subprocess.run(
        [KUBE_VALIDATE, "--strict", str(f)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "livenessProbee" in proc.stdout + proc.stderr


def test_schema_refuses_bad_values() -> None:
    for bad in (
        "controller.replicas=1",
        "storage.sessionTimeoutSeconds=1",  # below etcd's minimum lease TTL, as controllers'
        "etcd.replicas=2",
        "storage.podAntiAffinity=always",
        "clusterName=a/b",
        "logLevel=loud",
        "coordinator.logLevel=trace",
        "nope=1",
    ):
        proc = helm("template", "s", str(CHART), "--set", bad)
        assert proc.returncode != 0, bad
    proc = helm("template", "s", str(CHART), "--set", "etcd.enabled=false")
    assert proc.returncode != 0 and "externalEndpoints" in proc.stderr


def test_chart_refuses_acls_the_services_could_not_pass() -> None:
    """acls.enabled rendered `--super-users=` with no super users, and services that could
    not authenticate to each other (no mTLS, no service token) ran as User:ANONYMOUS with
    every internal call denied, or refused as unauthenticated under tokens (found from
    outside): helm now fails with the reason."""
    acls = "acls.enabled=true,acls.superUsers={User:CN=strom}"
    tls = "tls.enabled=true,tls.secretName=strom-tls"
    tokens = "auth.tokens.secretName=strom-tokens"
    for bad, reason in (
        ("acls.enabled=true", "acls.enabled needs acls.superUsers"),
        (acls, "acls.enabled needs the services to authenticate to each other"),
        (f"{acls},{tls}", "tls.clientAuth=required"),  # TLS, but no client certificates
        (f"{acls},{tokens}", "auth.tokens.serviceTokenKey"),  # tokens, none for the services
        (tokens, "auth.tokens.serviceTokenKey"),  # no ACLs, but callers must authenticate
        ("auth.tokens.serviceTokenKey=svc", "set the Secret too"),
        # Found from outside on the re-check: rendered, and silently did nothing.
        ("tls.clientAuth=required", "only TLS carries: set tls.enabled=true"),
        ("etcd.externalTls.secretName=etcd-tls", "the bundled etcd does not use it"),
    ):
        proc = helm("template", "s", str(CHART), "--set", bad)
        assert proc.returncode != 0 and reason in proc.stderr, (bad, proc.stderr)
    for good in (
        f"{acls},{tls},tls.clientAuth=required",
        f"{acls},{tokens},auth.tokens.serviceTokenKey=svc",
    ):
        args = container(by_kind(render([], sets=[good]), "StatefulSet")["strom-storage"])["args"]
        assert "--acls" in args and "--super-users=User:CN=strom;" in args


def test_super_users_with_commas_in_their_subject_stay_whole(tmp_path: Path) -> None:
    """The chart joined acls.superUsers with ',' and the services split the flag on every
    comma, so a certificate subject with several attributes (User:CN=strom,O=acme) became
    User:CN=strom and User:O=acme (found from outside). The chart now joins with ';' and
    ends with one, so each item is one principal; an item with a ';' is refused."""
    from strom.security.config import parse_super_users

    tls = "tls.enabled=true,tls.secretName=strom-tls,tls.clientAuth=required,acls.enabled=true"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"acls": {"superUsers": ["User:CN=strom,O=acme", "User:CN=admin"]}})
    )
    args = container(by_kind(render([values], sets=[tls]), "StatefulSet")["strom-storage"])["args"]
    [flag] = [a for a in args if a.startswith("--super-users=")]
    assert flag == "--super-users=User:CN=strom,O=acme;User:CN=admin;"
    assert parse_super_users([flag.split("=", 1)[1]]) == {"User:CN=strom,O=acme", "User:CN=admin"}
    # Two principals in one item rendered, and every service then refused the flag at start
    # (a crash loop; found from outside on the re-check): the schema refuses them.
    for bad in ("User:CN=strom;User:CN=x", "User:CN=strom,User:CN=admin", "User:a, User:b"):
        values.write_text(yaml.safe_dump({"acls": {"superUsers": [bad]}}))
        proc = helm("template", "s", str(CHART), "-f", str(values), "--set", tls)
        assert proc.returncode != 0 and "superUsers" in proc.stderr, bad


def test_chart_refuses_ephemeral_etcd_members_unless_told() -> None:
    """With etcd.persistence.enabled=false a member rescheduled with an empty data dir
    cannot rejoin (--initial-cluster-state=new: "member ... has already been bootstrapped",
    a crash loop; found from outside). More than one such member is refused unless
    etcd.allowEphemeral is set (a test install); persistent members get a claim each."""
    proc = helm("template", "s", str(CHART), "--set", "etcd.persistence.enabled=false")
    assert proc.returncode != 0
    assert "etcd.allowEphemeral=true" in proc.stderr and "already been bootstrapped" in proc.stderr
    # A single ephemeral member rendered without a word, though it loses all of strom's
    # metadata on every restart (found from outside): refused the same way.
    sets = ["etcd.persistence.enabled=false", "etcd.replicas=1"]
    proc = helm("template", "s", str(CHART), *(a for x in sets for a in ("--set", x)))
    assert proc.returncode != 0
    assert "etcd.allowEphemeral=true" in proc.stderr and "loses all of strom's" in proc.stderr
    for sets in (
        ["etcd.persistence.enabled=false", "etcd.allowEphemeral=true"],
        ["etcd.persistence.enabled=false", "etcd.replicas=1", "etcd.allowEphemeral=true"],
    ):
        etcd = by_kind(render([], sets=sets), "StatefulSet")["strom-etcd"]
        volumes = etcd["spec"]["template"]["spec"]["volumes"]
        assert volumes == [{"name": "data", "emptyDir": {}}]
    etcd = by_kind(render([]), "StatefulSet")["strom-etcd"]
    assert etcd["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    values = (CHART / "values.yaml").read_text()
    assert "for testing only" in values and "for testing" in (CHART / "README.md").read_text()


def test_chart_refuses_ephemeral_storage_unless_told() -> None:
    """storage.persistence.enabled=false rendered an emptyDir without a word: every pod
    re-created (rescheduled, evicted, each one of an upgrade) starts a node with an empty
    data dir, which copies all its replicas again and loses records no other replica holds
    (found from outside). Refused unless storage.allowEphemeral is set, as etcd's."""
    proc = helm("template", "s", str(CHART), "--set", "storage.persistence.enabled=false")
    assert proc.returncode != 0
    assert "storage.allowEphemeral=true" in proc.stderr and "empty data directory" in proc.stderr
    sets = ["storage.persistence.enabled=false", "storage.allowEphemeral=true"]
    storage = by_kind(render([], sets=sets), "StatefulSet")["strom-storage"]
    assert {"name": "data", "emptyDir": {}} in storage["spec"]["template"]["spec"]["volumes"]
    assert "volumeClaimTemplates" not in storage["spec"]
    storage = by_kind(render([]), "StatefulSet")["strom-storage"]
    assert storage["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    values = (CHART / "values.yaml").read_text()
    assert "storage.persistence.enabled" in (CHART / "README.md").read_text()
    assert values.count("for testing only") >= 2 and "allowEphemeral: false" in values


def test_values_name_the_services_principal_as_the_server_derives_it(tmp_path: Path) -> None:
    """acls.superUsers' comment said User:CN=<tls.crt subject CN>; the principal is the full
    RFC 4514 subject (found from outside): the example the comment gives is what a
    certificate of that subject authenticates as."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from strom.security.principal import principal_of_certificate

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "acme"),
            x509.NameAttribute(NameOID.COMMON_NAME, "strom"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    principal = principal_of_certificate(cert.public_bytes(serialization.Encoding.PEM))
    values = (CHART / "values.yaml").read_text()
    comment = values.split("superUsers:", 1)[0].rsplit("# --", 1)[1]
    assert principal == "User:CN=strom,O=acme" and principal in comment
    assert "subject CN" not in comment and "RFC 4514" in comment


def test_default_install_has_what_an_operator_needs() -> None:
    docs = render([])
    sts = by_kind(docs, "StatefulSet")
    storage = sts["strom-storage"]
    assert storage["spec"]["replicas"] == 3
    assert storage["spec"]["serviceName"] == "strom-storage-headless"
    assert storage["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    headless = by_kind(docs, "Service")["strom-storage-headless"]
    assert headless["spec"]["clusterIP"] == "None"
    node = container(storage)
    env = {e["name"]: e for e in node["env"]}
    assert env["STROM_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert node[probe]["grpc"]["port"] == 9092
    # Ready = back in its partitions' ISRs (a rolling restart waits for it); alive = started.
    assert node["readinessProbe"]["grpc"]["service"] == "strom.ready"
    assert "service" not in node["livenessProbe"]["grpc"]
    pod = storage["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert node["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert "podAntiAffinity" in pod["affinity"]
    assert sts["strom-controller"]["spec"]["replicas"] >= 2
    assert "strom-coordinator" in sts
    assert not by_kind(docs, "Deployment")
    assert sts["strom-etcd"]["spec"]["replicas"] == 3
    etcd_args = container(sts["strom-etcd"])["args"]
    # Without compaction etcd keeps every revision until its quota makes it read-only.
    assert "--auto-compaction-mode=periodic" in etcd_args
    assert "--auto-compaction-retention=1h" in etcd_args
    assert "--quota-backend-bytes=1073741824" in etcd_args
    assert set(by_kind(docs, "PodDisruptionBudget")) == {
        "strom-storage",
        "strom-controller",
        "strom-coordinator",
        "strom-etcd",
    }
    cm = by_kind(docs, "ConfigMap")["strom-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["strom.json"]) == json.loads(
        (ROOT / "deploy" / "grafana" / "strom-dashboard.json").read_text()
    )
    test_pod = by_kind(docs, "Pod")["strom-test-produce-consume"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "strom.service.selftest" in container(test_pod)["command"]
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "ClusterRole")


@pytest.mark.parametrize("name", ["default", "tls-and-monitoring"])
def test_every_probe_has_a_timeout_above_kubernetes_default_second(name: str) -> None:
    """Without timeoutSeconds a probe gets 1 s; the TLS exec probe (a Python health check)
    took up to 0.5 s on a loaded 2-core machine, close enough to restart healthy pods
    (found from outside)."""
    docs = render(VALUE_SETS[name])
    probes = 0
    for sts in by_kind(docs, "StatefulSet").values():
        c = container(sts)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in c:
                assert c[kind].get("timeoutSeconds", 1) >= 5, (sts["metadata"]["name"], kind)
                probes += 1
    assert probes == 3 * 3 + (3 if name == "default" else 0)  # 3 strom roles (+ etcd)


def test_notes_give_the_bootstrap_address_and_first_commands() -> None:
    proc = helm("install", "strom", str(CHART), "--dry-run=client", "--namespace", "streaming")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "strom-storage.streaming.svc.cluster.local:9092" in notes
    assert "topics create" in notes and "produce hello" in notes and "consume hello" in notes
    assert "helm test strom" in notes
    # Under TLS (tls-values: mTLS, ACLs) the commands carry the CA and the certificate.
    proc = helm(
        *("install", "strom", str(CHART), "--dry-run=client", "--namespace", "streaming"),
        *("-f", str(VALUE_SETS["tls-and-monitoring"][0])),
    )
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "plaintext" not in notes
    flags = "--ssl-cafile /etc/strom/tls/ca.crt --ssl-certfile /etc/strom/tls/tls.crt"
    assert notes.count(flags) == 3 and "kubectl run" not in notes


def test_external_etcd_replaces_the_bundled_one() -> None:
    docs = render(VALUE_SETS["external-etcd"])
    assert "strom-etcd" not in by_kind(docs, "StatefulSet")
    args = container(by_kind(docs, "StatefulSet")["strom-storage"])["args"]
    assert (
        "--etcd=etcd-0.etcd.infra.svc.cluster.local:2379,etcd-1.etcd.infra.svc.cluster.local:2379,"
        "etcd-2.etcd.infra.svc.cluster.local:2379" in args
    )


def test_external_etcd_tls_values_are_named_as_they_are() -> None:
    """The chart's refusal named etcd.endpoints, a value that does not exist (it is
    etcd.externalEndpoints), and values.yaml read as if tls.crt/tls.key were optional while
    every service is passed --etcd-cert and --etcd-key (found from outside)."""
    proc = helm("template", "s", str(CHART), "--set", "etcd.externalTls.secretName=etcd-tls")
    assert proc.returncode != 0
    assert "etcd.externalEndpoints" in proc.stderr and "etcd.endpoints" not in proc.stderr
    docs = render(VALUE_SETS["tls-and-monitoring"])
    for name in ("strom-storage", "strom-controller", "strom-coordinator"):
        args = container(by_kind(docs, "StatefulSet")[name])["args"]
        assert "--etcd-cert=/etc/strom/etcd-tls/tls.crt" in args, name
    values = (CHART / "values.yaml").read_text()
    comment = values.split("  externalTls:")[0].rsplit("# -- TLS to an external etcd", 1)[1]
    assert "client certificate, which is required" in comment


def test_zones_become_racks_of_five_nodes() -> None:
    docs = render(VALUE_SETS["zones-5-nodes"])
    storage = by_kind(docs, "StatefulSet")["strom-storage"]
    assert storage["spec"]["replicas"] == 5
    pod = storage["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["command"][:3] == ["python", "-m", "strom.service.kube_zone"]
    assert "--config=/etc/strom/node/rack.yaml" in container(storage)["args"]
    # The API token (allowed to get nodes) is the init container's alone: the pod mounted
    # one in every container, the long-running storage node's too (found from outside).
    assert pod["automountServiceAccountToken"] is False
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    (mount,) = [m for m in init["volumeMounts"] if m["mountPath"] == token_dir]
    assert mount["readOnly"] is True
    assert not [m for m in container(storage)["volumeMounts"] if m["name"] == mount["name"]]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    assert {"path": "token", "expirationSeconds": 3607} in [
        x["serviceAccountToken"] for x in sources if "serviceAccountToken" in x
    ]
    assert {"key": "ca.crt", "path": "ca.crt"} in next(
        x["configMap"]["items"] for x in sources if "configMap" in x
    )
    assert "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    role = by_kind(docs, "ClusterRole")
    assert [r["resources"] for r in next(iter(role.values()))["rules"]] == [["nodes"]]
    # No other pod gets an API token.
    for name in ("strom-controller", "strom-coordinator", "strom-etcd"):
        pod = by_kind(docs, "StatefulSet")[name]["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False


def test_tls_and_monitoring_objects(tmp_path: Path) -> None:
    docs = render(VALUE_SETS["tls-and-monitoring"])
    for obj in by_kind(docs, "StatefulSet").values():
        if obj["metadata"]["name"].endswith("-etcd"):
            continue
        mounts = {m["name"]: m for m in container(obj)["volumeMounts"]}
        assert mounts["tls"]["mountPath"] == "/etc/strom/tls" and mounts["tls"]["readOnly"]
        assert mounts["auth-tokens"]["readOnly"] and mounts["etcd-tls"]["readOnly"]
        args = container(obj)["args"]
        for flag in (
            "--tls-cert=/etc/strom/tls/tls.crt",
            "--tls-key=/etc/strom/tls/tls.key",
            "--tls-ca=/etc/strom/tls/ca.crt",
            "--tls-client-auth=required",
            "--auth-tokens=/etc/strom/auth/tokens",
            "--acls",
            "--super-users=User:CN=strom;",
            "--etcd-ca=/etc/strom/etcd-tls/ca.crt",
            "--etcd-cert=/etc/strom/etcd-tls/tls.crt",
            "--etcd-key=/etc/strom/etcd-tls/tls.key",
        ):
            assert flag in args, (obj["metadata"]["name"], flag)
        probe = container(obj)["readinessProbe"]
        assert probe["exec"]["command"][:5] == [
            *("python", "-m", "strom.service.healthcheck"),
            *("--service", "strom.ready"),
        ]
        port = container(obj)["ports"][0]["containerPort"]
        assert container(obj)["livenessProbe"]["exec"]["command"][3:] == [f"127.0.0.1:{port}"]
    sm = next(iter(by_kind(docs, "ServiceMonitor").values()))
    assert sm["spec"]["jobLabel"] == "strom.io/job"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["endpoints"][0]["relabelings"] == [
        {"targetLabel": "cluster", "replacement": "strom"}
    ]
    jobs = {
        s["metadata"]["labels"].get("strom.io/job")
        for s in by_kind(docs, "Service").values()
        if s["metadata"]["labels"].get("strom.io/metrics") == "true"
    }
    assert jobs == {"strom-storage", "strom-controller", "strom-coordinator"}
    rule = next(iter(by_kind(docs, "PrometheusRule").values()))
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump(rule["spec"]))
    proc = subprocess.run(
        [PROMTOOL, "check", "rules", str(f)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy/prometheus/strom-alerts.yml").read_text())


def operator_series_labels(
    sm: dict[str, Any], service: dict[str, Any], scraped: dict[str, str]
) -> dict[str, str]:
    """The labels prometheus-operator's scrape configuration gives a series ``scraped`` of a
    target behind ``service``: job from the Service's ``jobLabel`` label (else the Service's
    name), namespace, service = the Service's name, endpoint, then the endpoint's
    relabelings; a scraped label clashing with a target label wins under honorLabels, and is
    otherwise renamed exported_<name> (Prometheus' honor_labels)."""
    meta = service["metadata"]
    endpoint = sm["spec"]["endpoints"][0]
    target = {
        "job": meta["labels"].get(sm["spec"].get("jobLabel", ""), meta["name"]),
        "namespace": meta["namespace"],
        "service": meta["name"],
        "endpoint": endpoint["port"],
    }
    for r in endpoint.get("relabelings", []):
        target[r["targetLabel"]] = r["replacement"]
    out = dict(target)
    for name, value in scraped.items():
        if name in target and not endpoint.get("honorLabels"):
            out[f"exported_{name}"] = value
        else:
            out[name] = value
    return out


def test_service_monitor_keeps_the_labels_the_alerts_and_dashboard_use() -> None:
    """prometheus-operator gives every target service=<the Service's name>: without
    honorLabels strom's own `service` label (the role, docs/metrics.md) became
    exported_service, and `{service="controller"}`, the alerts' and the dashboard's
    `by (service)` broke on Kubernetes (found from outside). The job names are the ones the
    alert rules and the dashboard select."""
    docs = render(VALUE_SETS["tls-and-monitoring"])
    sm = next(iter(by_kind(docs, "ServiceMonitor").values()))
    assert all(e.get("honorLabels") is True for e in sm["spec"]["endpoints"])
    selected = [
        s
        for s in by_kind(docs, "Service").values()
        if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    jobs = set()
    for s in selected:
        role = s["metadata"]["labels"]["app.kubernetes.io/component"]
        labels = operator_series_labels(sm, s, {"service": role, "version": "1"})
        assert labels["service"] == role and "exported_service" not in labels, labels
        assert labels["cluster"] == "strom"
        jobs.add(labels["job"])
    assert jobs == {"strom-storage", "strom-controller", "strom-coordinator"}
    rules = (ROOT / "deploy/prometheus/strom-alerts.yml").read_text()
    named = {j for m in re.findall(r'job=~?"([^"]+)"', rules) for j in m.split("|")}
    assert named == jobs
    panels = json.loads((ROOT / "deploy/grafana/strom-dashboard.json").read_text())["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    patterns = re.findall(r'job=~"([^"]+)"', exprs)
    assert patterns and all(re.fullmatch(pat, j) for pat in patterns for j in jobs), patterns


def notes(*args: str) -> str:
    """The install notes (NOTES.txt) of a release named strom in namespace streaming."""
    proc = helm("install", "strom", str(CHART), "--dry-run=client", "-n", "streaming", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def san_covers(san: str, host: str) -> bool:
    """Whether a certificate's DNS name ``san`` matches ``host`` as TLS clients check it: a
    wildcard stands for exactly one leftmost label."""
    if san.startswith("*."):
        label, _, rest = host.partition(".")
        return bool(label) and rest == san[2:]
    return san == host


def test_every_advertised_host_is_a_dns_name_the_documented_sans_cover() -> None:
    """Under TLS a client verifies the server's certificate against the host it dials, which
    for a storage node, the active controller or a shard's coordinator is the address the
    pod advertises in etcd. The controllers and coordinators used to advertise $(POD_IP),
    which no certificate issued before the pods exist can name (found from outside). Every
    strom pod now advertises its StatefulSet DNS name, and the names the notes and the chart
    README tell you to put in tls.crt cover each of them and the bootstrap address."""
    sets = ["clusterDomain=corp.example", "tls.enabled=true", "tls.secretName=strom-tls"]
    docs = render([], namespace="streaming", sets=sets)
    text = notes(*(a for s in sets for a in ("--set", s)))
    listed = text.split("subject alternative names):", 1)[1].split("\n\n", 1)[0]
    sans = [line.strip() for line in listed.strip().splitlines()]
    assert "*.strom-controller-headless.streaming.svc.corp.example" in sans
    # The chart README's table says the same, with the release's names filled in.
    readme = (CHART / "README.md").read_text()
    readme = readme.split("## TLS: the names tls.crt must hold", 1)[1].split("\n## ", 1)[0]
    documented = {
        m.replace("<fullname>", "strom")
        .replace("<namespace>", "streaming")
        .replace("<clusterDomain>", "corp.example")
        for m in re.findall(r"^\| `([^`]+)` \|", readme, re.MULTILINE)
    }
    assert documented <= set(sans) and len(documented) == 4
    advertised = []
    for sts in by_kind(docs, "StatefulSet").values():
        if sts["metadata"]["name"].endswith("-etcd"):
            continue
        (arg,) = [a for a in container(sts)["args"] if a.startswith("--advertise=")]
        env = {e["name"]: e for e in container(sts)["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert sts["spec"]["serviceName"] in arg
        for i in range(sts["spec"]["replicas"]):
            pod = f"{sts['metadata']['name']}-{i}"
            host = arg.removeprefix("--advertise=").replace("$(POD_NAME)", pod).rsplit(":", 1)[0]
            advertised.append(host)
    assert len(advertised) == 3 + 2 + 2
    bootstrap = "strom-storage.streaming.svc.corp.example"
    for host in [*advertised, bootstrap]:
        with pytest.raises(ValueError):
            ipaddress.ip_address(host)
        assert any(san_covers(s, host) for s in sans), (host, sans)
        assert any(san_covers(s, host) for s in documented), host
    # Each advertised name resolves: its headless Service exists and publishes pods at once.
    services = by_kind(docs, "Service")
    for role in ("storage", "controller", "coordinator"):
        svc = services[f"strom-{role}-headless"]["spec"]
        assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions with In) on labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def test_zones_spread_counts_only_this_releases_pods_of_each_role() -> None:
    """ci/zones-values.yaml's spread constraint selected every strom storage pod of the
    namespace, another release's too (no app.kubernetes.io/instance; found from outside),
    and only storage could be spread at all: etcd, controllers and coordinators could all
    land in one zone (found from outside). Every role is spread now, and the selector the
    scheduler applies (matchLabels, plus matchLabelKeys' values from the pod itself; the
    chart's own for a constraint without one) is the release's pods of that role, whatever
    the release is called."""
    for release in ("strom", "billing"):
        docs = render(VALUE_SETS["zones-5-nodes"], release=release)
        sts = by_kind(docs, "StatefulSet")
        assert len(sts) == 4
        for obj in sts.values():
            pod = obj["spec"]["template"]
            labels = pod["metadata"]["labels"]
            (c,) = pod["spec"]["topologySpreadConstraints"]
            assert c["topologyKey"] == "topology.kubernetes.io/zone"
            selector = dict(c["labelSelector"]["matchLabels"])
            selector.update({k: labels[k] for k in c.get("matchLabelKeys", [])})
            assert selector.items() <= labels.items()
            assert selector["app.kubernetes.io/instance"] == release
            assert selector["app.kubernetes.io/component"] == labels["app.kubernetes.io/component"]


def test_each_role_takes_affinity_spread_priority_and_annotations(tmp_path: Path) -> None:
    """Only storage had topologySpreadConstraints, and no role took affinity rules or a
    PriorityClass, nor the etcd pods annotations (found from outside). Each role now does:
    a role's nodeAffinity and podAffinity are added to its podAntiAffinity switch's rule, a
    podAntiAffinity of its own replaces that rule; the manifests validate."""
    zone_a = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["strom"]}]}
        ]
    }
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "DoNotSchedule"}]  # fmt: skip
    own_anti = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone",
             "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "etcd"}}}
        ]
    }  # fmt: skip
    roles = ("storage", "controller", "coordinator", "etcd")
    values = {
        role: {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone_a}
            },
            "topologySpreadConstraints": spread,
            "priorityClassName": f"strom-{role}",
        }
        for role in roles
    }
    values["etcd"]["affinity"]["podAntiAffinity"] = own_anti
    values["etcd"]["podAnnotations"] = {"backup.example/enabled": "true"}
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    docs = render([f])
    validate(docs, tmp_path)
    sts = by_kind(docs, "StatefulSet")
    for role in roles:
        template = sts[f"strom-{role}"]["spec"]["template"]
        pod = template["spec"]
        assert pod["priorityClassName"] == f"strom-{role}"
        nodes = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert nodes == zone_a, role
        (c,) = pod["topologySpreadConstraints"]
        assert c["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        if role == "etcd":
            assert pod["affinity"]["podAntiAffinity"] == own_anti
            assert template["metadata"]["annotations"] == {"backup.example/enabled": "true"}
        else:  # the soft switch's rule, kept beside the node affinity
            (term,) = pod["affinity"]["podAntiAffinity"][
                "preferredDuringSchedulingIgnoredDuringExecution"
            ]
            assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    # Defaults: the switch's rule alone, no spread, no PriorityClass.
    for obj in by_kind(render([]), "StatefulSet").values():
        pod = obj["spec"]["template"]["spec"]
        assert set(pod["affinity"]) == {"podAntiAffinity"}
        assert "topologySpreadConstraints" not in pod and "priorityClassName" not in pod
    for bad in ("etcd.affinity.nodeAfinity.x=1", "controller.priorityClassName=1"):
        proc = helm("template", "s", str(CHART), "--set", bad)
        assert proc.returncode != 0, bad


def test_bundled_etcd_admits_only_stroms_own_pods() -> None:
    """The bundled etcd serves plaintext without authentication and holds the ACLs, so any
    pod that reached it could rewrite them (found from outside). A NetworkPolicy (on by
    default) admits its client port only from the release's strom and etcd pods, its peer
    port only from etcd members; an external etcd or networkPolicy.enabled=false: none."""
    docs = render([])
    (policy,) = by_kind(docs, "NetworkPolicy").values()
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    pods = {
        name: sts["spec"]["template"]["metadata"]["labels"]
        for name, sts in by_kind(docs, "StatefulSet").items()
    }
    assert selects(spec["podSelector"], pods["strom-etcd"])
    assert not any(selects(spec["podSelector"], pods[n]) for n in pods if n != "strom-etcd")
    rules = {r["ports"][0]["port"]: r.get("from") for r in spec["ingress"]}
    assert set(rules) == {2379, 2380, 2381}
    assert rules[2381] is None  # /health and /metrics: probes and Prometheus
    for port, allowed in ((2379, set(pods)), (2380, {"strom-etcd"})):
        (peer,) = rules[port]
        assert {n for n in pods if selects(peer["podSelector"], pods[n])} == allowed, port
        assert "namespaceSelector" not in peer and "ipBlock" not in peer
        # Not the helm test pod or the ACL Job, nor another release's strom pods.
        other = {**pods["strom-storage"], "app.kubernetes.io/instance": "other"}
        assert not selects(peer["podSelector"], other)
        test_pod = by_kind(docs, "Pod")["strom-test-produce-consume"]["metadata"]["labels"]
        assert not selects(peer["podSelector"], test_pod)
    assert not by_kind(render(VALUE_SETS["external-etcd"]), "NetworkPolicy")
    assert not by_kind(render([], sets=["etcd.networkPolicy.enabled=false"]), "NetworkPolicy")


def test_chart_copies_of_deploy_files_are_identical() -> None:
    assert (CHART / "files" / "strom-alerts.yml").read_text() == (
        ROOT / "deploy" / "prometheus" / "strom-alerts.yml"
    ).read_text(), "cp deploy/prometheus/strom-alerts.yml helm/strom/files/"
    assert (CHART / "dashboards" / "strom.json").read_text() == (
        ROOT / "deploy" / "grafana" / "strom-dashboard.json"
    ).read_text(), "run deploy/grafana/build_dashboard.py"


def test_each_role_can_run_its_own_image_tag_for_an_upgrade_in_order() -> None:
    """`helm upgrade` of image.tag rolled every StatefulSet at once, against the documented
    order (controllers, then coordinators, then storage nodes: docs/reliability.md
    "Upgrades"). A role's imageTag moves that role alone; unset, each follows image.tag."""
    roles = ("controller", "coordinator", "storage")

    def images(sets: list[str]) -> dict[str, str]:
        sts = by_kind(render([], sets=sets), "StatefulSet")
        out = {role: container(sts[f"strom-{role}"])["image"] for role in roles}
        init = sts["strom-storage"]["spec"]["template"]["spec"].get("initContainers", [])
        out.update({f"storage/{c['name']}": c["image"] for c in init})
        return out

    assert set(images(["image.tag=1.0"]).values()) == {"strom:1.0"}
    staged = images(["image.tag=1.0", "controller.imageTag=1.1"])
    assert staged["controller"] == "strom:1.1"
    assert {v for k, v in staged.items() if k != "controller"} == {"strom:1.0"}
    # The storage nodes' init container (the rack lookup) follows its role too.
    zoned = images(["image.tag=1.0", "storage.imageTag=1.1", "storage.rack.fromNodeZone=true"])
    assert zoned["storage"] == zoned["storage/rack-from-zone"] == "strom:1.1"
    assert zoned["controller"] == zoned["coordinator"] == "strom:1.0"
    proc = helm("template", "x", str(CHART), "--set", "coordinator.imageTag=1")
    assert proc.returncode != 0 and "imageTag" in proc.stderr  # a number, not a string


#: templates/_lookup.tpl as the chart ships it: the one place that asks the API server.
LOOKUP = '{{- lookup "apps/v1" "StatefulSet" .ctx.Release.Namespace .name | toJson }}'


def upgrade(
    tmp_path: Path, running: list[dict[str, Any]], sets: list[str]
) -> subprocess.CompletedProcess[str]:
    """Render the chart as ``helm upgrade`` would over a release whose StatefulSets the
    cluster holds as ``running``. ``lookup`` finds nothing without an API server, so a copy
    of the chart has its one lookup (templates/_lookup.tpl) read them from a file instead;
    every guard is the chart's own template, run by the real helm."""
    chart = tmp_path / "chart"
    if chart.exists():
        shutil.rmtree(chart)
    shutil.copytree(CHART, chart)
    lookup = chart / "templates" / "_lookup.tpl"
    assert LOOKUP in lookup.read_text()
    fake = '{{- get (.ctx.Files.Get "running.json" | fromJson) .name | default dict | toJson }}'
    lookup.write_text(lookup.read_text().replace(LOOKUP, fake))
    (chart / "running.json").write_text(json.dumps({d["metadata"]["name"]: d for d in running}))
    args = ["template", "strom", str(chart), "--namespace", "streaming"]
    for s in sets:
        args += ["--set", s]
    return helm(*args)


def running(sets: list[str]) -> list[dict[str, Any]]:
    """The StatefulSets a release installed with ``sets`` has in the cluster."""
    return list(by_kind(render([], sets=sets), "StatefulSet").values())


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> bool:
    return proc.returncode != 0 and all(w in proc.stderr for w in words)


def test_upgrade_refuses_another_etcd_size(tmp_path: Path) -> None:
    """A changed etcd.replicas rendered: new members started with
    --initial-cluster-state=new and formed a cluster of their own, removed pods stayed
    members (found from outside). `helm upgrade` now refuses it, naming the procedure."""
    installed = running([])
    proc = upgrade(tmp_path, installed, ["etcd.replicas=5"])
    assert refused(proc, "etcd.replicas is fixed after install", "has 3 members", "ask for 5")
    section = "The bundled etcd's size"
    assert section in proc.stderr and f"## {section}" in (CHART / "README.md").read_text()
    assert refused(upgrade(tmp_path, installed, ["etcd.replicas=1"]), "etcd.replicas")
    assert upgrade(tmp_path, installed, ["image.tag=v2"]).returncode == 0
    # A first install, and `helm template` (no release to look up), take any size.
    assert upgrade(tmp_path, [], ["etcd.replicas=5"]).returncode == 0
    assert by_kind(render([], sets=["etcd.replicas=5"]), "StatefulSet")["strom-etcd"]
    # Moving to an external etcd is not a size change.
    external = ["etcd.enabled=false", "etcd.externalEndpoints={etcd-0:2379}"]
    assert upgrade(tmp_path, installed, external).returncode == 0


def test_upgrade_refuses_a_storage_scale_down_unless_told(tmp_path: Path) -> None:
    """Scaling storage.replicas down removed the highest-numbered nodes with the replicas
    they held (Parallel pod management: at once), unguarded and undocumented (found from
    outside). Refused unless storage.allowScaleDown, naming the nodes and the reassignment
    to do first; scaling up is fine."""
    installed = running(["storage.replicas=5"])
    proc = upgrade(tmp_path, installed, ["storage.replicas=3"])
    assert refused(proc, "storage.replicas 5 -> 3 removes storage nodes 3,4")
    assert "strom topics reassign" in proc.stderr and "Removing storage nodes" in proc.stderr
    ok = upgrade(tmp_path, installed, ["storage.replicas=3", "storage.allowScaleDown=true"])
    assert ok.returncode == 0, ok.stderr
    assert upgrade(tmp_path, installed, ["storage.replicas=7"]).returncode == 0
    assert upgrade(tmp_path, installed, ["storage.replicas=5"]).returncode == 0


def test_upgrade_refuses_a_volume_size_change_with_the_procedure(tmp_path: Path) -> None:
    """Growing storage.persistence.size failed on upgrade with Kubernetes' "updates to
    statefulset spec ... are forbidden" (volumeClaimTemplates are immutable; found from
    outside). The chart says so and names the procedure; sizes are compared by value, as the
    API server stores them in canonical form (1024Gi comes back as 1Ti)."""
    installed = running(["storage.persistence.size=1024Gi"])
    proc = upgrade(tmp_path, installed, ["storage.persistence.size=2Ti"])
    assert refused(proc, "storage.persistence cannot change", "Growing the volumes")
    assert "--cascade=orphan" in proc.stderr
    for d in installed:
        for vct in d["spec"].get("volumeClaimTemplates", []):
            if vct["spec"]["resources"]["requests"]["storage"] == "1024Gi":
                vct["spec"]["resources"]["requests"]["storage"] = "1Ti"
    assert upgrade(tmp_path, installed, ["storage.persistence.size=1024Gi"]).returncode == 0
    assert refused(upgrade(tmp_path, running([]), ["etcd.persistence.size=4Gi"]), "etcd.")
    # After the procedure the StatefulSet is gone (orphaned pods): the upgrade goes through.
    others = [d for d in installed if d["metadata"]["name"] != "strom-storage"]
    assert upgrade(tmp_path, others, ["storage.persistence.size=2Ti"]).returncode == 0


def test_upgrade_refuses_turning_tls_on_or_off_unless_acknowledged(tmp_path: Path) -> None:
    """`helm upgrade --set tls.enabled=true` on a running release rolled the storage nodes
    one by one and never finished: the first restarted node cannot fetch from its plaintext
    peers, so it never became ready (found from outside). Refused unless acknowledged,
    after every strom pod was stopped; other changes under TLS roll as before."""
    tls = ["tls.enabled=true", "tls.secretName=strom-tls"]
    plain = running([])
    proc = upgrade(tmp_path, plain, tls)
    assert refused(proc, "tls.enabled false -> true cannot roll", "Turning TLS on or off")
    assert upgrade(tmp_path, plain, [*tls, "tls.allowChangeOnUpgrade=true"]).returncode == 0
    secure = running(tls)
    assert refused(upgrade(tmp_path, secure, []), "tls.enabled true -> false")
    assert upgrade(tmp_path, secure, [*tls, "image.tag=v2"]).returncode == 0
    tokens = ["auth.tokens.secretName=t", "auth.tokens.serviceTokenKey=svc"]
    assert upgrade(tmp_path, plain, tokens).returncode == 0  # tokens roll (the README says so)
    for doc in (CHART / "README.md", ROOT / "docs" / "security.md"):
        assert "Turning TLS on or off" in doc.read_text(), doc


def test_no_disruption_budget_for_a_single_pod() -> None:
    """With one etcd member or one storage node the PodDisruptionBudget said maxUnavailable
    1: it protected nothing while it looked as if it did (found from outside). A role of one
    pod gets no budget (one allowing no disruption would block every node drain); with more
    pods the budget stays."""
    sets = [
        "etcd.replicas=1",
        "storage.replicas=1",
        "coordinator.replicas=1",
        "controller.defaultReplicationFactor=1",
    ]
    assert set(by_kind(render([], sets=sets), "PodDisruptionBudget")) == {"strom-controller"}
    budgets = by_kind(render([]), "PodDisruptionBudget")
    assert len(budgets) == 4
    assert all(b["spec"]["maxUnavailable"] == 1 for b in budgets.values())
    assert "none for a role of one pod" in (CHART / "README.md").read_text()


def test_log_level_is_global_with_a_per_role_override() -> None:
    """``logLevel`` reaches every strom service as --log-level (info by default); a role's
    own ``logLevel`` overrides it. The chart had no way to set a level but extraArgs."""
    roles = ("strom-storage", "strom-controller", "strom-coordinator")

    def levels(sets: list[str]) -> dict[str, list[str]]:
        sts = by_kind(render([], sets=sets), "StatefulSet")
        return {
            r: [a for a in container(sts[r])["args"] if a.startswith("--log-level")] for r in roles
        }

    assert levels([]) == {r: ["--log-level=info"] for r in roles}
    assert levels(["logLevel=warn", "coordinator.logLevel=debug"]) == {
        "strom-storage": ["--log-level=warn"],
        "strom-controller": ["--log-level=warn"],
        "strom-coordinator": ["--log-level=debug"],
    }
