#!/usr/bin/env bash
# Builds the agentrl sandbox image without a container registry: debootstrap a minimal Debian
# bookworm root with python3 from a Debian package mirror, then `docker import` it. Equivalent to
# the Dockerfile next to this script.
#
#   tools/image/build_offline.sh [TAG]          # default tag: agentrl/sandbox:bookworm
#
# Needs root, debootstrap and a reachable Docker daemon (honours DOCKER_HOST). The rootfs is cached
# under ${AGENTRL_IMAGE_CACHE:-$HOME/.cache/agentrl/sandbox-rootfs} so a rebuild only re-imports.
set -euo pipefail
TAG="${1:-agentrl/sandbox:bookworm}"
MIRROR="${AGENTRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${AGENTRL_IMAGE_CACHE:-$HOME/.cache/agentrl/sandbox-rootfs}"
ROOTFS="$CACHE/bookworm"

if [[ "$(id -u)" -ne 0 ]]; then
  echo "build_offline.sh: debootstrap needs root (run as root or with sudo)" >&2
  exit 2
fi
command -v debootstrap >/dev/null || { echo "build_offline.sh: debootstrap missing: apt-get install debootstrap" >&2; exit 2; }

if [[ ! -f "$ROOTFS/.agentrl-complete" ]]; then
  rm -rf "$ROOTFS"
  mkdir -p "$CACHE"
  debootstrap --variant=minbase --include=python3 bookworm "$ROOTFS" "$MIRROR" >&2
  # Keep the image small: package lists, docs and caches are not needed at run time.
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/usr/share/doc/* \
         "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
  mkdir -p "$ROOTFS/opt/agentrl"
  touch "$ROOTFS/.agentrl-complete"
fi

tar --numeric-owner --exclude=./.agentrl-complete -C "$ROOTFS" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'USER 65534:65534' \
  --change 'WORKDIR /tmp' \
  --change 'CMD ["sleep", "infinity"]' \
  - "$TAG" >&2
echo "$TAG"
