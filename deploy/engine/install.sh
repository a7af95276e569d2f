#!/usr/bin/env bash
# Install the Nexus engine as a systemd service on this host, from a checkout that ran `make setup`.
#
#   sudo deploy/engine/install.sh [--prefix /opt/nexus] [--root /]      then: systemctl enable --now nexus-engine
#
# --prefix  where the checkout (with its .venv) lives; ExecStart is rewritten to PREFIX/.venv/bin/nexus.
# --root    install into this directory instead of / (packaging, tests): no user, no systemctl.
# Idempotent: an existing /etc/nexus/engine.env is kept (the example is written next to it).
set -euo pipefail

prefix=/opt/nexus
root=/
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --root) root=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=${root%/}

if [ -z "$root" ] && [ ! -x "$prefix/.venv/bin/nexus" ]; then
  echo "install.sh: $prefix/.venv/bin/nexus not found: clone the repo to $prefix and run 'make setup' there" >&2
  exit 1
fi

case "$prefix" in
  /home/*|/root/*|/run/user/*)
    echo "install.sh: warning: the unit sets ProtectHome=yes, so the engine cannot read $prefix;" \
         "use a checkout outside /home and /root (e.g. /opt/nexus)" >&2 ;;
esac

install -d -m 0755 "$root/etc/systemd/system"
install -d -m 0750 "$root/etc/nexus"
sed "s#^ExecStart=/opt/nexus/#ExecStart=$prefix/#" "$here/nexus-engine.service" > "$root/etc/systemd/system/nexus-engine.service"
chmod 0644 "$root/etc/systemd/system/nexus-engine.service"
install -m 0640 "$here/nexus-engine.env.example" "$root/etc/nexus/engine.env.example"
if [ ! -e "$root/etc/nexus/engine.env" ]; then
  install -m 0640 "$here/nexus-engine.env.example" "$root/etc/nexus/engine.env"
  echo "wrote $root/etc/nexus/engine.env: set NEXUS_ENGINE_STORE_URL before starting"
fi

if [ -z "$root" ]; then
  getent group nexus >/dev/null || groupadd --system nexus
  getent passwd nexus >/dev/null || useradd --system --gid nexus --home-dir /var/lib/nexus-engine \
    --no-create-home --shell /usr/sbin/nologin nexus
  chgrp nexus /etc/nexus /etc/nexus/engine.env /etc/nexus/engine.env.example
  systemctl daemon-reload
  echo "installed; start it with: systemctl enable --now nexus-engine"
else
  echo "installed into $root"
fi
