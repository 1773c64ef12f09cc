#!/usr/bin/env bash
# System packages the test suite needs (Debian): shellcheck for the shell drivers; a C++ compiler and ninja for
# the torch_npu double's C++ part (tests/fake_npu/torch_npu/_double_native.cpp, built at its first import by
# torch.utils.cpp_extension). Installs only what is missing; as root with apt-get, else one line naming the fix.
set -eu
missing=()
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages: ${missing[*]}: install them (Debian: apt-get install ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" >/dev/null
