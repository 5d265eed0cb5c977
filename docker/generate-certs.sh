#!/usr/bin/env bash
# CA, a certificate for every service name the containers dial, and one key pair per SuperNode,
# into docker/certs/ (for compose.tls.yml). Needs pflower installed (scripts/setup.sh does it).
#
# The containers run as uid 49999 (the user `app` of Flower's images), so the private keys must
# be readable by that uid. Run as root (or with sudo), the files are handed to uid 49999 and stay
# mode 0600. Run as another user, who cannot hand files to another uid, the private keys are
# made readable by every local user (demo keys only: say `sudo chown -R 49999:49999 docker/certs`
# to make them private again); the script says which it did.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PFLOWER_PYTHON:-../.venv/bin/python}"
APP_UID=49999
"$PY" -m pflower.deploy certs --dir certs --nodes 3 \
  --host superlink --host supernode-0 --host supernode-1 --host supernode-2
if [ "$(id -u)" = 0 ]; then
  chown -R "$APP_UID:$APP_UID" certs
  echo "docker/certs/ belongs to uid $APP_UID (the containers' user); private keys mode 0600"
else
  chmod 0644 certs/server.key certs/keys/node?
  echo "warning: the private keys in docker/certs/ are readable by every local user (the containers'" \
       "uid $APP_UID must read them); 'sudo chown -R $APP_UID:$APP_UID docker/certs' makes them private" >&2
fi
