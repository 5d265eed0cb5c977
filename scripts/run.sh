#!/usr/bin/env bash
# The main job: a Flower simulation (10 clients) with the run config of pyproject.toml.
# Extra arguments go to pflower-sim, e.g.: scripts/run.sh -c "method='fedprox' num-server-rounds=30"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${PFLOWER_VENV:-.venv}/bin/pflower-sim" "$@"
