#!/usr/bin/env bash
# Build a Debian bookworm base image without any container registry: debootstrap a minimal root file system from
# a Debian mirror and `docker import` it. The result stands in for `debian:bookworm-slim` as the BASE_IMAGE build
# arg of every images/*/Dockerfile.
#
# Usage: build-base.sh [TAG]        (default TAG: ds4deploy/debian:bookworm-local)
# Env:   DEBIAN_MIRROR              (default http://deb.debian.org/debian)
# Exit:  0 built (or already present), 2 could not build (message says why and what to do).
set -euo pipefail

tag=${1:-ds4deploy/debian:bookworm-local}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

fail() { echo "error: $1" >&2; echo "fix: $2" >&2; exit 2; }

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "present: $tag"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  apt-get install -y -qq debootstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; } \
    || fail "debootstrap is not installed and apt could not install it" "install debootstrap, then retry"
fi

root=$(mktemp -d /var/tmp/ds4-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || fail "debootstrap from $mirror failed (log: $root.log)" "set DEBIAN_MIRROR to a reachable Debian mirror"
rm -f "$root.log"
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
SOURCES
# Same trims as the official slim image: no apt lists or caches in the layer.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "built: $tag"
