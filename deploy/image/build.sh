#!/bin/sh
# Builds the relay's image: deploy/image/build.sh [TAG] (default outbox:dev).
# The binary is static (CGO_ENABLED=0: every driver is pure Go) and carries its
# version (outbox version); the certificates are the build machine's.
set -eu
tag=${1:-outbox:dev}
root=$(cd "$(dirname "$0")/../.." && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# At a release's tag (v1.2.3, which `go run ./internal/release` makes) the binary says
# that version; elsewhere it says (devel) and its revision. VERSION overrides both.
release=${VERSION:-$(git -C "$root" describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null || true)}
ldflags='-s -w'
if [ -n "$release" ]; then ldflags="$ldflags -X github.com/outboxd/outbox/internal/version.stamped=$release"; fi
(cd "$root" && CGO_ENABLED=0 go build -trimpath -buildvcs=true -ldflags="$ldflags" -o "$ctx/outbox" ./cmd/outbox)
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
cp "$root/deploy/image/Containerfile" "$ctx/"
# OCI labels: what a registry, a scanner or `podman inspect` shows of the image.
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
version=${release:-$(git -C "$root" describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo unknown)}
set -- --label org.opencontainers.image.title=outbox \
  --label org.opencontainers.image.description="The outbox relay: publishes a transactional outbox to brokers" \
  --label org.opencontainers.image.source=https://github.com/outboxd/outbox \
  --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.version="$version" \
  -t "$tag" -f "$ctx/Containerfile"
if command -v buildah >/dev/null; then
  buildah ${BUILDAH_OPTS:-} bud --quiet "$@" "$ctx"
elif command -v podman >/dev/null; then
  podman build "$@" "$ctx"
else
  docker build "$@" "$ctx"
fi
