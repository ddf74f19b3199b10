#!/usr/bin/env bash
# Build the Containerfile's default base (a Debian bookworm root with Python 3.11, venv and pip) from
# Debian packages with mmdebstrap and import it under the public slim image's name, for machines that
# reach Debian's mirror but no container registry. Where a registry is reachable, `podman pull` the
# public image instead and skip this. Needs root (or a working unshare), mmdebstrap and podman.
#   deploy/base-image.sh [TAG]   (default docker.io/library/python:3.11-slim-bookworm)
set -euo pipefail
TAG="${1:-docker.io/library/python:3.11-slim-bookworm}"
HERE="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"
if podman image exists "$TAG"; then echo "base image $TAG already present"; exit 0; fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mmdebstrap --variant=minbase --mode=root \
  --include=python3,python3-venv,python3-pip,ca-certificates,libgomp1,curl,tini \
  --customize-hook='chroot "$1" ln -sf /usr/bin/python3 /usr/local/bin/python' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$TMP/rootfs.tar"
podman import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$TMP/rootfs.tar" "$TAG"
echo "imported $TAG"
