"""deploy/kubernetes: every document valid (strict: no unknown fields) against the schemas of a
current Kubernetes, and wired to what the app really serves and reads: the probe and metrics
paths are its routes, the environment its settings, the names match one another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.37.0"
DOCS = [
    doc
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
]
BY_KIND = {doc["kind"]: doc for doc in DOCS}


def pod(kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = BY_KIND[kind]["spec"]["template"]
    return spec


@pytest.mark.parametrize("doc", DOCS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DOCS])
def test_each_document_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_manifests_name_what_the_app_serves_and_reads(client: TestClient) -> None:
    settings = {f"BATCHPLAN_{name.upper()}" for name in Settings.model_fields}
    for kind in ("Deployment", "DaemonSet"):
        template = pod(kind)
        [container] = template["spec"]["containers"]
        port = container["ports"][0]["containerPort"]
        assert container["command"][-1] == str(port)  # uvicorn listens where the probes look
        probes = [
            container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe", "startupProbe")
        ]
        assert sorted(set(probes)) == ["/livez", "/readyz"]
        assert all(client.get(path).status_code == 200 for path in probes)
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        metrics = client.get(annotations["prometheus.io/path"])
        assert metrics.status_code == 200 and "# TYPE" in metrics.text
        assert annotations["prometheus.io/port"] == str(port)
        env = {e["name"]: e for e in container["env"]}
        assert set(env) <= settings
        assert env["BATCHPLAN_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "batchplan",
            "key": "api-key",
        }
        security = template["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["requests"] and container["resources"]["limits"]


def test_the_service_and_autoscaler_reach_the_planner() -> None:
    deployment, service, hpa = BY_KIND["Deployment"], BY_KIND["Service"], BY_KIND["HorizontalPodAutoscaler"]
    labels = pod("Deployment")["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    # The autoscaler measures CPU against the containers' requests: they must have one.
    [container] = pod("Deployment")["spec"]["containers"]
    assert "cpu" in container["resources"]["requests"]


def test_the_worker_runs_on_gpu_nodes_with_its_job_database_on_a_volume() -> None:
    spec = pod("DaemonSet")["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    [worker] = spec["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] >= 1
    db = Path(next(e["value"] for e in worker["env"] if e["name"] == "BATCHPLAN_JOBS_DB"))
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "hostPath" in volumes[mounts[str(db.parent)]]
