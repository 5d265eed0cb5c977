#!/usr/bin/env bash
# CA, a certificate for every service name the containers dial, and one key pair per SuperNode,
# into docker/certs/ (for compose.tls.yml). Needs pflower installed (scripts/setup.sh does it).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PFLOWER_PYTHON:-../.venv/bin/python}"
"$PY" -m pflower.deploy certs --dir certs --nodes 3 \
  --host superlink --host supernode-0 --host supernode-1 --host supernode-2
