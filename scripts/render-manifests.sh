#!/usr/bin/env bash
# Render the Helm chart with its default values into the plain manifest, for users without Helm:
#   bash scripts/render-manifests.sh > deploy/kubernetes/vllm-with-kvwatch.yaml
# tests/test_deploy.py runs this and fails if the checked-in file differs.
set -euo pipefail
cd "$(dirname "$0")/.."
HELM=${HELM:-$(command -v helm || echo .venv/bin/helm)}
cat <<'HEADER'
# vLLM with the kvwatch sidecar in one pod, its Service, the webhook Secret and a PodMonitor.
# Rendered from the Helm chart with its defaults; do not edit by hand:
#   helm template vllm-llama deploy/helm/vllm-kvwatch   (scripts/render-manifests.sh)
# kvwatch's rules: kubectl apply -f alerts/kvwatch-prometheusrule.yaml
HEADER
"$HELM" template vllm-llama deploy/helm/vllm-kvwatch
