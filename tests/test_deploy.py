"""The deployment examples in deploy/ and the objects `kvwatch alerts` generates beside the rules:
they parse, Prometheus and Alertmanager accept their configs (promtool, amtool), the Kubernetes
objects match their schemas, and the pod wires vLLM and the sidecar together with flags kvwatch
really has. The plain pod manifest is the Helm chart's render (tests/test_helm_chart.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvwatch.alerts.autoscaling import KEDA_FILE
from kvwatch.alerts.build import K8S_FILE
from kvwatch.alerts.routing import ALERTMANAGER_FILE
from kvwatch.cli import build_parser
from kvwatch.sidecar.outputs.webhooks import load_receivers

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
CRD_SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"
ALERTS = Path(__file__).resolve().parents[1] / "alerts"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_every_yaml_file_parses() -> None:
    # (a Helm chart's templates are YAML only once rendered: the chart's tests render them)
    files = [
        f
        for f in sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
        if "templates" not in f.relative_to(DEPLOY).parts
    ]
    files += [ALERTS / ALERTMANAGER_FILE, ALERTS / KEDA_FILE]
    assert len(files) >= 6
    for f in files:
        assert _docs(f), f


def test_prometheus_config_and_the_rules_it_loads_are_valid() -> None:
    p = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 rule files found" in p.stdout + p.stderr
    cfg = _docs(DEPLOY / "prometheus" / "prometheus.yml")[0]
    (vllm,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "vllm"]
    (rename,) = vllm["metric_relabel_configs"]
    assert rename["regex"] == "vllm_(.*)" and rename["replacement"] == "vllm:$1"


def test_alertmanager_config_is_valid() -> None:
    p = subprocess.run(
        ["amtool", "check-config", str(ALERTS / ALERTMANAGER_FILE)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_kubernetes_pod_wires_vllm_and_the_sidecar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = {d["kind"]: d for d in _docs(DEPLOY / "kubernetes" / "vllm-with-kvwatch.yaml")}
    assert set(docs) == {"Deployment", "Secret", "Service", "PodMonitor"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in pod["containers"]}
    # the sidecar's arguments are ones kvwatch accepts
    ns = build_parser().parse_args(c["kvwatch"]["args"])
    assert ns.command is None or ns.command == []
    # vLLM writes its output where the sidecar reads it, on a volume both mount
    vllm_cmd = " ".join(c["vllm"]["args"])
    assert f"tee -a {ns.log}" in vllm_cmd and "pipefail" in vllm_cmd
    mounts = {n: {m["name"]: m["mountPath"] for m in c[n]["volumeMounts"]} for n in c}
    assert (
        Path(ns.log).parent.as_posix()
        == mounts["vllm"]["vllm-log"]
        == mounts["kvwatch"]["vllm-log"]
    )
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}["vllm-log"]
    port = int(ns.target[0].rsplit(":", 1)[1])
    assert port == c["vllm"]["ports"][0]["containerPort"] and "--port 8000" in vllm_cmd
    # the PodMonitor scrapes both named ports
    names = {p["name"] for x in c.values() for p in x["ports"]}
    eps = docs["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert {e["port"] for e in eps} == names == {"http", "kvwatch"}
    assert ns.listen.endswith(":9477") and c["kvwatch"]["ports"][0]["containerPort"] == 9477
    # the webhook config in the Secret is one the sidecar loads
    hooks = tmp_path / "webhooks.yaml"
    hooks.write_text(docs["Secret"]["stringData"]["webhooks.yaml"])
    secret_env = {e["name"] for e in c["kvwatch"]["env"]}
    for name in secret_env:
        monkeypatch.setenv(name, "s3cret")
    receivers = load_receivers([], hooks)
    assert [r.format for r in receivers] == ["alertmanager", "slack", "json"]
    assert {r.secret_env for r in receivers if r.secret_env} <= secret_env


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    (provider,) = _docs(DEPLOY / "grafana" / "provisioning" / "dashboards" / "kvwatch.yaml")
    assert provider["providers"][0]["type"] == "file"
    (ds,) = _docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    assert ds["datasources"][0]["type"] == "prometheus"


def _manifests() -> list[dict[str, Any]]:
    """Every Kubernetes object kvwatch ships: the pod example and the generated PrometheusRule."""
    docs = _docs(DEPLOY / "kubernetes" / "vllm-with-kvwatch.yaml")
    return docs + _docs(Path(__file__).resolve().parents[1] / "alerts" / K8S_FILE)


def test_core_objects_match_kubernetes_schemas() -> None:
    """Deployment, Service, Secret against Kubernetes' own OpenAPI schemas (strict: an
    unknown field is an error), as kubernetes-validate ships them for each release."""
    import kubernetes_validate

    core = [d for d in _manifests() if "monitoring.coreos.com" not in d["apiVersion"]]
    assert {d["kind"] for d in core} == {"Deployment", "Service", "Secret"}
    for version in ("1.29.0", kubernetes_validate.latest_version()):
        for doc in core:
            kubernetes_validate.validate(doc, version, strict=True)
    broken = json.loads(json.dumps(next(d for d in core if d["kind"] == "Deployment")))
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def _crd_check(docs: list[dict[str, Any]]) -> list[list[Any]]:
    p = subprocess.run(
        ["node", str(CRD_SCHEMAS / "validate.mjs")], input=json.dumps(docs), capture_output=True,
        text=True, cwd=CRD_SCHEMAS, timeout=60, check=True,
    )  # fmt: skip
    result: list[list[Any]] = json.loads(p.stdout)
    return result


def test_operator_objects_match_their_crd_schemas() -> None:
    """PodMonitor and PrometheusRule against the Prometheus Operator's CRD schemas (npm
    @kubernetes-models/prometheus-operator, installed by setup into tests/crd_schemas)."""
    ops = [d for d in _manifests() if d["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {d["kind"] for d in ops} == {"PodMonitor", "PrometheusRule"}
    assert [err for _, _, err in _crd_check(ops)] == [None, None]
    broken = json.loads(json.dumps(ops))
    for d in broken:
        if d["kind"] == "PrometheusRule":
            d["spec"]["groups"][1]["rules"][0]["for"] = "5 minutes"
        else:
            d["spec"]["podMetricsEndpoints"][0]["interval"] = 5
    assert all(err for _, _, err in _crd_check(broken))


def test_autoscaler_matches_kedas_schema_and_scales_the_shipped_deployment() -> None:
    """The ScaledObject `kvwatch alerts` writes: KEDA's CRD schema (npm @kubernetes-models/keda),
    aimed at the example's Deployment, on the fleet's recorded need for its served model."""
    (so,) = _docs(ALERTS / KEDA_FILE)
    assert [err for _, _, err in _crd_check([so])] == [None]
    deployment = {d["kind"]: d for d in _docs(DEPLOY / "kubernetes" / "vllm-with-kvwatch.yaml")}[
        "Deployment"
    ]
    assert so["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    vllm = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] == "vllm")  # fmt: skip
    served = vllm["args"][0].split("vllm serve ")[1].split()[0].strip("'")
    (trigger,) = so["spec"]["triggers"]
    assert (
        trigger["metadata"]["query"]
        == f'max(kvwatch:fleet_replicas_needed{{model_name="{served}"}})'
    )
    broken = json.loads(json.dumps(so))
    broken["spec"]["maxReplicaCount"] = "eight"
    assert all(err for _, _, err in _crd_check([broken]))
