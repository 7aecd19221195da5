"""``python -m strom.service.kube_zone OUT.yaml``: write ``rack: <zone>`` for the storage node
about to start on this Kubernetes node (the Helm chart's init container).

Why: a pod cannot read its node's labels through the downward API, so the zone label
(``topology.kubernetes.io/zone``) is read from the API server with the pod's service account
(the chart grants ``get`` on nodes) and handed to ``strom storage-node --config OUT.yaml``,
which takes ``rack`` from it. A node without a zone label gets no rack (a warning says so).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")


def zone_of(node: Mapping[str, Any]) -> str | None:
    """The zone label of a Node object (the first of ZONE_LABELS present)."""
    labels = node.get("metadata", {}).get("labels", {}) or {}
    for key in ZONE_LABELS:
        if labels.get(key):
            return str(labels[key])
    return None


def fetch_node(name: str, env: Mapping[str, str], sa_dir: Path = SA_DIR) -> dict[str, Any]:
    host = env.get("KUBERNETES_SERVICE_HOST")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("KUBERNETES_SERVICE_HOST is not set: not running in a pod")
    token = (sa_dir / "token").read_text().strip()
    ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
    req = urllib.request.Request(
        f"https://{host}:{port}/api/v1/nodes/{name}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
        return json.loads(resp.read())


def write_config(path: Path, zone: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"rack": zone} if zone else {}))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m strom.service.kube_zone OUT.yaml", file=sys.stderr)
        return 2
    node = os.environ.get("NODE_NAME")
    if not node:
        print(
            "kube_zone: NODE_NAME is not set (spec.nodeName via the downward API)", file=sys.stderr
        )
        return 1
    try:
        zone = zone_of(fetch_node(node, os.environ))
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"kube_zone: cannot read node {node}: {exc}", file=sys.stderr)
        return 1
    if zone is None:
        print(
            f"kube_zone: node {node} has no zone label; the storage node gets no rack",
            file=sys.stderr,
        )
    write_config(Path(args[0]), zone)
    print(f"kube_zone: node {node} is in zone {zone!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
