#!/usr/bin/env bash
# System packages the test suite needs (Debian): shellcheck for the shell drivers.
set -eu
if command -v shellcheck >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "shellcheck is missing: install it (Debian: apt-get install shellcheck)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq shellcheck >/dev/null
