#!/usr/bin/env bash
# Installs the Debian packages listed in scripts/setup/apt-packages.txt that are missing.
set -euo pipefail
ROOT="${AGENTRL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
list="$ROOT/scripts/setup/apt-packages.txt"
[[ -f "$list" ]] || exit 0
mapfile -t wanted < <(grep -v '^\s*#' "$list" | awk 'NF{print $1}')
missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi
echo "[setup] apt: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
