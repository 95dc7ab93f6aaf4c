#!/usr/bin/env bash
# Installs the build dependencies from Debian/Ubuntu packages. The CUDA toolkit (NVRTC and
# cuda.h) is expected at /usr/local/cuda or on the PATH; it is not installed here.
# Usage: scripts/ci/install_deps.sh [EXTRA_PACKAGE...]   (extra packages come in the same apt run:
# .ci/run adds clang for the fuzz targets, so a fresh machine updates the package lists once)
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config patch libfmt-dev libxxhash-dev doctest-dev libcli11-dev libsodium-dev python3-venv python3-dev
  libhiredis-dev libcurl4-openssl-dev redis-server nginx-light patchelf
  "$@")
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || [ -f /usr/local/cuda/include/nvrtc.h ] || {
  echo "install_deps: the CUDA toolkit (NVRTC) was not found under /usr/local/cuda" >&2
  exit 1
}
echo "install_deps: ok"
