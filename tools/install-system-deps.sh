#!/usr/bin/env bash
# Install the Debian packages listed in tools/system-packages.txt that are not installed yet.
# Idempotent and quick when nothing is missing (no apt-get update then).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$here/system-packages.txt")
missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
echo "Installing Debian packages: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
# Debian starts a packaged daemon on install and enables it for boot; of prometheus only promtool is
# wanted. A policy-rc.d that refuses every start (unless the machine has its own) keeps the install
# from starting anything, and the server stays disabled afterwards.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# tools/install-system-deps.sh: no daemon starts during this install\nexit 101\n' \
    | "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod 0755 "$policy"
  trap '"${sudo_cmd[@]}" rm -f "$policy"' EXIT
fi
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
for pkg in "${missing[@]}"; do
  if [ "$pkg" = prometheus ]; then
    # Works without a running systemd too (it removes the boot symlink); upgrades keep it disabled.
    "${sudo_cmd[@]}" systemctl disable --quiet prometheus.service
  fi
done
