#!/usr/bin/env bash
# Build the small local test image without any registry: debootstrap a minimal Debian
# with python3 (+ pip and IPython so the kernel's magics can be tested), then
# `docker import` it. Reused when the tag already exists with this script's contents
# (its label names the revision), so CI pays for it once.
set -euo pipefail
tag=${1:-sandbox-kernel-test:bookworm}
# Revision 2: git (egress tests clone from a local git server through the proxy).
revision=2
if [ "$(docker image inspect -f '{{index .Config.Labels "sandbox-kernel.test-image"}}' "$tag" 2>/dev/null)" = "$revision" ]; then
  echo "test image $tag already present"
  exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; }
root=$(mktemp -d /tmp/sk-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
echo "debootstrapping $tag from $mirror (about a minute)"
debootstrap --variant=minbase --include=python3,python3-pip,python3-ipython,ca-certificates,git \
  bookworm "$root" "$mirror" >/tmp/sk-debootstrap.log 2>&1 || { tail -20 /tmp/sk-debootstrap.log; exit 1; }
# Keep the image small: apt caches and docs are not needed at run time.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' --change "LABEL sandbox-kernel.test-image=$revision" - "$tag" >/dev/null
echo "built $tag: $(docker image inspect -f '{{.Size}}' "$tag") bytes"
