#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv (or $PFLOWER_VENV).
# Idempotent: it reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PFLOWER_VENV:-.venv}"
STAMP="$VENV/.pflower-installed"
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
echo "Setting up $VENV (torch comes from the local wheel cache; about 2 minutes)..." >&2
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# pip's local-index warnings are noise here; its exit status still counts (pipefail).
"$VENV/bin/python" -m pip install --quiet -e ".[test,docs]" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
"$VENV/bin/python" -c "import flwr, torch, pflower.server_app, pflower.client_app.app" \
  || { echo "setup failed: pflower does not import" >&2; exit 1; }
echo "$WANT" > "$STAMP"
