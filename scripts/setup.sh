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
START=$SECONDS
echo "Setting up $VENV: pflower, Flower, PyTorch and the test and docs tools (110 s on a fresh clone on the Intel Xeon of docs/measurements.md) ..." >&2
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# pip's progress, a line for each package it collects and one for what it installed (not every
# requirement already satisfied, nor its local-index warnings); all of it in $LOG, whose end is
# shown if pip fails.
LOG="$VENV/pip-install.log"
if ! "$VENV/bin/python" -m pip install --progress-bar off -e ".[test,docs]" 2>&1 | tee "$LOG" \
  | { grep --line-buffered -E "^(Collecting|Installing collected|Successfully installed)" | sed -u -E "s/^(.{0,160}).*/  pip: \1/" >&2 || true; }; then
  echo "setup failed: pip install (the end of $LOG):" >&2
  tail -n 20 "$LOG" >&2
  exit 1
fi
"$VENV/bin/python" -c "import flwr, torch, pflower.server_app, pflower.client_app.app" \
  || { echo "setup failed: pflower does not import" >&2; exit 1; }
echo "$WANT" > "$STAMP"
echo "Set up $VENV in $((SECONDS - START)) s" >&2
