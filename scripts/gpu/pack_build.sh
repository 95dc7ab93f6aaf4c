#!/usr/bin/env bash
# Packs what the GPU scripts run from a build tree into a directory small enough to carry to a GPU
# machine (about 25 MB), which need not have this machine's shared libraries: the GPU suite's test
# binary, the bench, the sm_90a check and the CLI, stripped, at their paths in the build tree (so
# that DEST serves as BUILD_DIR to scripts/gpu/*.sh and scripts/bench/*.sh), and under DEST/lib
# every shared library they load beyond the C and C++ runtimes, NVRTC and the driver (hiredis,
# libsodium, libcurl and what it loads), found there through the binaries' own search path, since
# a GPU machine's image need not hold the remote tier's and the signatures' libraries.
# Usage: scripts/gpu/pack_build.sh BUILD_DIR DEST_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/gpu/pack_build.sh BUILD_DIR DEST_DIR" >&2; exit 2; }
build=$1 dest=$2
command -v patchelf > /dev/null || { echo "pack_build.sh: patchelf is needed (apt-get install patchelf)" >&2; exit 2; }
binaries=(tests/astrai_gpu_tests bench/astrai-bench bench/astrai-sm90-check tools/astrai-jit)
for b in "${binaries[@]}"; do
  [ -x "$build/$b" ] || { echo "pack_build.sh: $build/$b is not built (ninja ${b##*/})" >&2; exit 2; }
done
rm -rf "$dest"
mkdir -p "$dest/lib"
# Left to the GPU machine: the C and C++ runtimes (its own are newer), NVRTC and the driver (the
# toolkit's and the GPU's own).
system='^(linux-vdso|ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libresolv|libnvrtc[^ ]*|libcuda)\.so'
for b in "${binaries[@]}"; do
  mkdir -p "$dest/$(dirname "$b")"
  cp "$build/$b" "$dest/$b"
  strip "$dest/$b"
  old=$(patchelf --print-rpath "$dest/$b")
  # DT_RPATH, unlike DT_RUNPATH, also serves the libraries' own needs (libcurl's).
  patchelf --force-rpath --set-rpath "\$ORIGIN/../lib${old:+:$old}" "$dest/$b"
  ldd "$build/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $system ]] || cp -L "$path" "$dest/lib/$name"
  done
done
# Every packed library must resolve its own needs from lib/ or the system set above, here.
for b in "${binaries[@]}"; do
  if ldd "$dest/$b" | grep -q "not found"; then
    echo "pack_build.sh: $dest/$b does not resolve:" >&2; ldd "$dest/$b" | grep "not found" >&2; exit 1
  fi
done
echo "pack_build.sh: $dest ($(du -sh "$dest" | cut -f1)): ${binaries[*]} and $(ls "$dest/lib" | wc -l) libraries"
