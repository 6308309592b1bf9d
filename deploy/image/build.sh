#!/bin/sh
# Builds the relay's image: deploy/image/build.sh [TAG] (default outbox:dev).
# The binary is static (CGO_ENABLED=0: every driver is pure Go) and carries its
# version (outbox version); the certificates are the build machine's.
set -eu
tag=${1:-outbox:dev}
root=$(cd "$(dirname "$0")/../.." && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
(cd "$root" && CGO_ENABLED=0 go build -trimpath -buildvcs=true -ldflags='-s -w' -o "$ctx/outbox" ./cmd/outbox)
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
cp "$root/deploy/image/Containerfile" "$ctx/"
if command -v buildah >/dev/null; then
  buildah ${BUILDAH_OPTS:-} bud --quiet -t "$tag" -f "$ctx/Containerfile" "$ctx"
elif command -v podman >/dev/null; then
  podman build -t "$tag" -f "$ctx/Containerfile" "$ctx"
else
  docker build -t "$tag" -f "$ctx/Containerfile" "$ctx"
fi
