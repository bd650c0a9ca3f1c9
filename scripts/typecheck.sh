#!/usr/bin/env bash
# Type-check the whole package with mypy (strict on the sidecar and sizing, see pyproject.toml).
# The folders install as kvwatch.* through setuptools' package-dir, which mypy cannot follow
# through an editable install, so this lays the package out as the wheel does, in links.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/kvwatch"
for f in kvwatch/*; do [ "$(basename "$f")" = __pycache__ ] || ln -s "$PWD/$f" "$tree/kvwatch/$(basename "$f")"; done
for pkg in sidecar loadgen dashboards alerts; do ln -s "$PWD/$pkg" "$tree/kvwatch/$pkg"; done
cd "$tree"
exec "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p kvwatch "$@"
