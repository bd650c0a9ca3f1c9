#!/usr/bin/env bash
# Set up everything kvwatch needs on a fresh Debian machine; safe to run again (it skips what is done).
#   - Debian packages the tests use (Prometheus, Alertmanager, promtool, Chromium, Node.js,
#     openssl for a test certificate)
#   - .venv with kvwatch, vLLM for CPU and the test tools
#   - Grafana's dashboard types and TypeScript (npm, in dashboards/typecheck), and the
#     Prometheus Operator's CRD schemas (npm, in tests/crd_schemas)
#   - the tiny local model (in $KVWATCH_CACHE or ~/.cache/kvwatch)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(prometheus prometheus-alertmanager chromium openssl)
command -v npm >/dev/null || APT_PACKAGES+=(nodejs npm)
# pip drags these in with vLLM; they are CUDA-linked and break `import vllm.entrypoints` on CPU.
CUDA_ONLY=(torchvision torchaudio torchcodec triton)

say() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.13 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { say "need Python 3.11 or newer"; exit 2; }

if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PY"
  "$PY" -m venv .venv
fi

# Reinstall only when the dependency list changed.
stamp=".venv/.kvwatch-deps-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "installing kvwatch with vLLM (CPU) into .venv (about 2 minutes the first time)"
  # (the grep hides pip's notes about this machine's local wheel folders; pip's status decides)
  .venv/bin/pip install -q --disable-pip-version-check -e '.[cpu,test]' 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "pip install failed"; exit 1; }
  .venv/bin/pip uninstall -y -q "${CUDA_ONLY[@]}" 2>/dev/null || true
  .venv/bin/python -c 'import vllm.entrypoints.openai.api_server' 2>/dev/null \
    || { say "vLLM does not import in .venv"; exit 1; }
  rm -f .venv/.kvwatch-deps-*
  touch "$stamp"
fi

# Wheels of the core's dependencies: tests/test_install.py installs the built wheel from them
# alone (pip --no-index), so the as-installed test needs no package index.
wh_stamp=".wheelhouse/.kvwatch-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$wh_stamp" ]; then
  say "downloading the core's dependency wheels into .wheelhouse"
  rm -rf .wheelhouse
  mapfile -t core_deps < <(.venv/bin/python -c 'import tomllib
for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]: print(d)')
  .venv/bin/pip download -q --disable-pip-version-check --only-binary=:all: -d .wheelhouse \
    "${core_deps[@]}" 2>&1 | { grep -v "^WARNING: Location" || true; }
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "pip download failed"; exit 1; }
  touch "$wh_stamp"
fi

say "tiny model: $(.venv/bin/kvwatch loadgen build-model 2>/dev/null)"

# npm folders: Grafana's dashboard types with TypeScript; the Prometheus Operator's CRD schemas
for dir in dashboards/typecheck tests/crd_schemas; do
  npm_stamp="$dir/node_modules/.kvwatch-$(sha256sum "$dir/package-lock.json" | cut -c1-16)"
  if [ ! -f "$npm_stamp" ]; then
    say "installing npm packages in $dir (npm ci)"
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
    touch "$npm_stamp"
  fi
done
