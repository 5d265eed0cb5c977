#!/usr/bin/env bash
# The test suite (unit, in-process federation, and real Flower simulations). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
exec "${PFLOWER_VENV:-.venv}/bin/python" -m pytest "$@"
