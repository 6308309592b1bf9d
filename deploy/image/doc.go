// Package image holds the relay's container image (Containerfile, build.sh) and the
// test that proves the image complete: built with buildah, unpacked, and its
// entrypoint run as its user in a chroot, relaying from PostgreSQL to NATS.
package image
